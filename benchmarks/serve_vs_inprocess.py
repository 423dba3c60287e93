"""The cost of HTTP: the same workload through `wavepp serve` (HTTP, `wavepp bench --url`'s
client) and through the Engine in-process (`wavepp bench`), same model, pp, policy and dtype.

    python benchmarks/serve_vs_inprocess.py --model smollm2 --pp 2 --workload short-suffix \
        --prefix-len 512 --suffix-len 64 --concurrency 8 --num-requests 64 --repeat 3

Each repeat runs both, in alternating order (HTTP first on even repeats): a server in a
subprocess on a free loopback port (started with --debug so its caches are emptied before the
run, as the in-process bench's are), then stopped with SIGTERM; an Engine in this process,
then shut down. Only one pipeline is up at a time. Both warm up, then run every prompt from
empty caches in a closed loop at the concurrency. TTFT is the client's over HTTP (request sent
-> response read) and the engine's in-process (arrival -> first token). Prints the medians
and the ratios HTTP / in-process, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time


from wavepp.bench.http import reset_caches, run_http_closed_loop, server_info, wait_until_healthy
from wavepp.bench.measure import run_closed_loop
from wavepp.bench.report import machine
from wavepp.cli.bench import build_workloads
from wavepp.models import load_model_config
from wavepp.runtime.launch import free_port
from wavepp.serve.loadgen import run_load
from wavepp.model_store import resolve_model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--policy", default="wavepp")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--workload", default="short-suffix", help="comma list, as wavepp bench's")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--prefix-len", type=int, default=512)
    p.add_argument("--suffix-len", type=int, default=64)
    p.add_argument("--num-groups", type=int, default=8)
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args()
    args.trace_file, args.tokens_per_block = None, 32

    vocab_size = load_model_config(resolve_model(args.model)).vocab_size
    workloads = build_workloads(args, vocab_size, args.num_requests)
    print(f"model={args.model} pp={args.pp} policy={args.policy} dtype={args.dtype} c={args.concurrency} "
          f"on {machine()}", flush=True)
    rows = []
    for rep in range(args.repeat):
        order = ("http", "in-process") if rep % 2 == 0 else ("in-process", "http")
        for mode in order:
            t0 = time.perf_counter()
            ms = _over_http(args, workloads, rep) if mode == "http" else _in_process(args, workloads, rep)
            for m in ms:
                rows.append({"mode": mode, **m.to_dict()})
                print(f"  run {rep + 1} {mode:10s} {m.workload}: {m.input_tok_s:8,.0f} input tok/s, TTFT p50 "
                      f"{m.ttft_p50_ms:6,.0f} ms p95 {m.ttft_p95_ms:6,.0f} ms, hit {m.hit_rate:.1%} "
                      f"({time.perf_counter() - t0:.0f} s with start and stop)", flush=True)
    _print_table(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": {**vars(args), "machine": machine()}, "rows": rows}, f, indent=1)
    return 0


def _over_http(args, workloads, rep: int) -> list:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "wavepp.cli", "serve", "--model", args.model,
                               "--pp", str(args.pp), "--policy", args.policy, "--dtype", args.dtype,
                               "--port", str(port), "--debug"], stderr=subprocess.DEVNULL)
    try:
        wait_until_healthy(url, server)
        info = server_info(url)
        warm = run_load(url, [wl.prompts[0][:256] for wl in workloads], concurrency=len(workloads))
        assert warm.num_ok == len(workloads), warm.errors
        out = []
        for wl in workloads:
            assert reset_caches(info)
            out.append(run_http_closed_loop(info, wl, args.concurrency, repeat=rep))
        return out
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _in_process(args, workloads, rep: int) -> list:
    from wavepp.engine import Engine

    with Engine(args.model, pp=args.pp, policy=args.policy, dtype=args.dtype) as engine:
        engine.prefill([wl.prompts[0][:256] for wl in workloads])
        out = []
        for wl in workloads:
            engine.reset()
            out.append(run_closed_loop(engine, wl, args.concurrency, policy_label=args.policy, repeat=rep))
        return out


def _print_table(rows: list[dict], args) -> None:
    med = {}
    for (wl, mode) in {(r["workload"], r["mode"]) for r in rows}:
        ms = [r for r in rows if r["workload"] == wl and r["mode"] == mode]
        med[wl, mode] = {k: statistics.median(r[k] for r in ms) for k in ("input_tok_s", "ttft_p50_ms",
                                                                          "ttft_p95_ms", "hit_rate")}
    print(f"\nmedians of {args.repeat} interleaved runs (c={args.concurrency}, {args.num_requests} requests)")
    print("| workload | path | input tok/s | TTFT p50 ms | TTFT p95 ms | hit rate |")
    print("|---|---|---|---|---|---|")
    for wl in sorted({w for w, _ in med}):
        h, i = med[wl, "http"], med[wl, "in-process"]
        for mode, m in (("in-process", i), ("HTTP", h)):
            print(f"| {wl} | {mode} | {m['input_tok_s']:,.0f} | {m['ttft_p50_ms']:,.0f} | {m['ttft_p95_ms']:,.0f} "
                  f"| {m['hit_rate']:.1%} |")
        print(f"| {wl} | HTTP / in-process | {h['input_tok_s'] / i['input_tok_s']:.2f}x | "
              f"{h['ttft_p50_ms'] / i['ttft_p50_ms']:.2f}x | {h['ttft_p95_ms'] / i['ttft_p95_ms']:.2f}x | |")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
