"""Does a subscriber that never reads slow the engine? Throughput with KV cache events on, with
and without such a subscriber, interleaved; medians.

    python benchmarks/bench_kv_events.py --model smollm2 --pp 2 --repeat 5

One Engine publishes KV cache events (--kv-events-config's JSON, a small ZeroMQ high-water mark
so that the stalled subscriber's queue fills early). Each repeat runs the workload twice from
empty caches (engine.reset), in alternating order: with nobody subscribed, and with a SUB
socket connected that never reads. The workload churns the cache (more groups of shared
prefixes than the pools hold) so that blocks are stored and removed all along: many events.
With --events-off, an engine without events runs the same workload afterwards, `repeat` times
(another engine: not interleaved with the others). Prints the medians of input tokens/s and
of TTFT p50, the ratio stalled / none, the events sent and dropped, and the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from wavepp.bench.measure import run_closed_loop  # noqa: E402
from wavepp.bench.report import machine  # noqa: E402
from wavepp.engine import Engine  # noqa: E402
from wavepp.runtime.launch import free_port  # noqa: E402
from wavepp.workloads.synthetic import reuse  # noqa: E402


def main() -> None:
    args = parse_args()
    port = free_port()
    events = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "hwm": args.hwm}
    options = dict(pp=args.pp, dtype=args.dtype, block_size=args.block_size)
    if args.stage_num_blocks:
        options["stage_num_blocks"] = tuple(int(n) for n in args.stage_num_blocks.split(","))
    print(f"model={args.model} pp={args.pp} dtype={args.dtype} c={args.concurrency} "
          f"events={json.dumps(events)} on {machine()}", flush=True)
    rows: dict[str, list] = {"none": [], "stalled": [], "off": []}
    with Engine(args.model, kv_events=_events_config(events), **options) as engine:
        workload = reuse(
            args.num_requests, args.num_groups, args.prompt_len, args.reuse_ratio,
            vocab_size=engine.vocab_size, block_size=args.block_size,
        )
        print(f"workload: {workload.description}", flush=True)
        _run(engine, workload, args, "none", port)  # warm-up
        for repeat in range(args.repeat):
            order = ("none", "stalled") if repeat % 2 == 0 else ("stalled", "none")
            for label in order:
                rows[label].append(_run(engine, workload, args, label, port, repeat))
    if args.events_off:
        with Engine(args.model, **options) as engine:
            _run(engine, workload, args, "off", port)  # warm-up
            for repeat in range(args.repeat):
                rows["off"].append(_run(engine, workload, args, "off", port, repeat))
    _report(rows)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--stage-num-blocks",
        default="512,256",
        help="each stage's blocks: fewer than the groups' prefixes need, so the cache churns "
        "('' : the engine's default)",
    )
    p.add_argument("--num-requests", type=int, default=128)
    p.add_argument("--num-groups", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--reuse-ratio", type=float, default=0.875, help="shared prefix / prompt")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--hwm", type=int, default=100, help="the PUB socket's high-water mark")
    p.add_argument("--events-off", action="store_true", help="also an engine without events")
    return p.parse_args()


def _events_config(events: dict):
    from wavepp.kv_events import KVEventsConfig

    return KVEventsConfig(**events)


def _run(engine, workload, args, label: str, port: int, repeat: int = -1) -> dict:
    """One run from empty caches; with `label` "stalled", a subscriber that never reads."""
    engine.reset()
    sub = None
    if label == "stalled":
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.setsockopt_string(zmq.SUBSCRIBE, "")
        time.sleep(0.5)  # its subscription reaches the publisher; then it never reads
    before = engine.kv_events_counts() or {}
    try:
        m = run_closed_loop(engine, workload, args.concurrency, policy_label=label, repeat=repeat)
    finally:
        if sub is not None:
            sub.close(linger=0)
    after = engine.kv_events_counts() or {}
    sent = after.get("published_events", 0) - before.get("published_events", 0)
    dropped = after.get("dropped_batches", 0) - before.get("dropped_batches", 0)
    row = {"tok_s": m.input_tok_s, "ttft_ms": m.ttft_p50_ms, "events": sent, "dropped": dropped}
    if repeat >= 0:
        print(f"  {label:8s} repeat {repeat}: {m.input_tok_s:9.0f} tok/s, TTFT p50 "
              f"{m.ttft_p50_ms:7.1f} ms, {sent} events sent, {dropped} batches dropped",
              flush=True)
    return row


def _report(rows: dict[str, list]) -> None:
    print("\n| subscriber | input tok/s (median) | TTFT p50 (median) | events sent | "
          "batches dropped |\n|---|---|---|---|---|")
    medians = {}
    for label, runs in rows.items():
        if not runs:
            continue
        tok_s = statistics.median(r["tok_s"] for r in runs)
        ttft = statistics.median(r["ttft_ms"] for r in runs)
        medians[label] = tok_s
        events = statistics.median(r["events"] for r in runs)
        dropped = statistics.median(r["dropped"] for r in runs)
        name = {"none": "none", "stalled": "never reads", "off": "(events off)"}[label]
        print(f"| {name} | {tok_s:.0f} | {ttft:.1f} ms | {events:.0f} | {dropped:.0f} |")
    print(f"\nthroughput, never-reading subscriber / none: "
          f"{medians['stalled'] / medians['none']:.3f}")
    if "off" in medians:
        print(f"throughput, events on (none) / events off: {medians['none'] / medians['off']:.3f}"
              " (separate engines, not interleaved)")


if __name__ == "__main__":
    main()
