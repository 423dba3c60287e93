"""What the KV hand-off costs: a stage's export alone, and the pipeline with and without it.

    python benchmarks/bench_kv_export.py --micro          # one stage's copy and hand-off, per prompt length
    python benchmarks/bench_kv_export.py --model smollm2 --pp 2 --concurrency 8,64 --repeat 2 \
        --transport directory,mooncake
    python benchmarks/bench_kv_export.py --answer --repeat 5   # how much later a hand-off is answered

--micro: SmolLM2's half (15 layers) in bf16 pools, a request's blocks scattered over the pool;
for the directory store times `PagedPools.export_rows` (the copy the stage makes before the wave
completes) and what the writer thread does off the stage's path (safetensors packing plus
the store's atomic write); for mooncake the one copy of the request's blocks straight into the
arena (on the stage's compute loop, in place of `export_rows`) and the decode side's
pull of every token but the last with a transfer engine of its own in another process (TCP on
loopback: the bytes cross the kernel's socket path as they would a NIC), medians of 5.

Closed loop: `wavepp bench`'s short-suffix workload (8 groups, 1,536-token prefixes, 64-token
suffixes) through one Engine per transport (the directory store: `kv_store_max_gib` keeps the disk
bounded; mooncake: each stage's arena drops its oldest parts, nothing pulls them), runs with and
without `kv_transfer=True` alternated, each from empty caches; medians of input tokens/s.

--answer: one request at a time, prompts of fresh random tokens, with and without the hand-off
alternated: the time from the first token (the result's `ttft_s`) to the answer (the future
resolved), which with the hand-off includes the wait for every stage's part to be written.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _puller_child(conn) -> None:
    """Another process's transfer engine: pulls what it is sent, answers the seconds it took."""
    from wavepp.kv_transfer.mooncake.puller import ArenaPuller

    puller = ArenaPuller("127.0.0.1")
    while (job := conn.recv()) is not None:
        stages, start, end = job
        t0 = time.perf_counter()
        puller.pull(stages, start, end)
        conn.send(time.perf_counter() - t0)
    puller.close()


def micro() -> None:
    import multiprocessing as mp
    import random

    import torch

    from wavepp.kv_transfer.directory import DirectoryStore
    from wavepp.kv_transfer.directory.writer import DirectoryWriter
    from wavepp.kv_transfer.mooncake.writer import ArenaWriter
    from wavepp.models import load_model_config, page_layout, stage_specs
    from wavepp.models.paged_pools import PagedPools
    from wavepp.model_store import resolve_model

    config = load_model_config(resolve_model("smollm2"))
    spec = stage_specs(config.num_layers, 2)[0]
    pools = PagedPools(page_layout(config), spec, 1024, 16, torch.bfloat16)
    for t in pools.tensors.values():
        t.normal_()
    rng = random.Random(0)
    manifest = {"stage_id": 0, "layers": [spec.start_layer, spec.end_layer], "dtype": "bfloat16"}
    arena = ArenaWriter(0, host="127.0.0.1", arena_bytes=2**30)
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_puller_child, args=(child,), daemon=True)
    proc.start()
    with tempfile.TemporaryDirectory() as root:
        directory = DirectoryWriter(DirectoryStore(root))
        print(f"one stage of SmolLM2 ({spec.end_layer - spec.start_layer} layers, bf16), medians of 5")
        print("| prompt tokens | MB per stage | directory: copy out of the pools (compute loop) | "
              "pack + write (writer) | write MB/s | mooncake: blocks into the arena (compute loop) | "
              "pull (another process) | pull MB/s |")
        print("|---|---|---|---|---|---|---|---|")
        for n in (512, 1600, 4096):
            table = rng.sample(range(1024), -(-n // 16))
            times = {"copy": [], "write": [], "arena": [], "pull": []}
            for i in range(5):
                t0 = time.perf_counter()
                rows = directory.stage(pools, table, n)
                t1 = time.perf_counter()
                directory.store.write_request(f"r{n}-{i}", {"token_ids": [], "num_stages": 2})
                directory.put(f"r{n}-{i}", rows, n, manifest)
                t2 = time.perf_counter()
                location = arena.put(f"r{n}-{i}", arena.stage(pools, table, n), n, manifest)
                t3 = time.perf_counter()
                parent.send(([location], 0, n - 1))
                times["pull"].append(parent.recv())
                times["copy"].append(t1 - t0)
                times["write"].append(t2 - t1)
                times["arena"].append(t3 - t2)
                arena.release(location)
                arena.tick(time.monotonic())
            mb = sum(t.numel() * t.element_size() for _, t in rows.values()) / 1e6
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"| {n:,} | {mb:.1f} | {med['copy'] * 1e3:.1f} ms | {med['write'] * 1e3:.1f} ms | "
                  f"{mb / med['write']:,.0f} | {med['arena'] * 1e3:.1f} ms | {med['pull'] * 1e3:.1f} ms | "
                  f"{mb * (n - 1) / n / med['pull']:,.0f} |", flush=True)
    parent.send(None)
    proc.join(30)
    arena.close()


def closed_loop(args) -> None:
    from wavepp.bench import run_closed_loop
    from wavepp.engine import Engine
    from wavepp.workloads import make_workload

    rows = {}
    for transport in args.transport:
        with tempfile.TemporaryDirectory() as root:
            options = (dict(kv_store=root, kv_store_max_gib=args.store_gib) if transport == "directory"
                       else dict(kv_transport="mooncake", kv_host="127.0.0.1"))
            with Engine(args.model, pp=args.pp, **options) as engine:
                for c in args.concurrency:
                    workload = make_workload("short_suffix", num_requests=max(64, 2 * c), num_groups=8,
                                             prefix_len=1536, suffix_len=64)
                    for r in range(args.repeat):
                        for export in (False, True):
                            engine.reset()
                            m = run_closed_loop(engine, workload, c, policy_label="wavepp", repeat=r,
                                                submit_options={"kv_transfer": True} if export else None)
                            rows.setdefault((transport, c, export), []).append(m.input_tok_s)
                            print(f"{transport} c={c} export={'on' if export else 'off'} run {r + 1}: "
                                  f"{m.input_tok_s:,.0f} input tok/s", flush=True)
    print(f"\n{args.model} pp={args.pp}, short-suffix 1,536 + 64, medians of {args.repeat}")
    print("| transport | concurrency | without export | with export | ratio |\n|---|---|---|---|---|")
    for transport in args.transport:
        for c in args.concurrency:
            off = statistics.median(rows[(transport, c, False)])
            on = statistics.median(rows[(transport, c, True)])
            print(f"| {transport} | {c} | {off:,.0f} | {on:,.0f} | {on / off:.3f} |")


def answer_wait(args) -> None:
    import random

    from wavepp.engine import Engine

    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as root, \
            Engine(args.model, pp=args.pp, kv_store=root, kv_store_max_gib=args.store_gib,
                   profile_waves=False) as engine:
        print(f"{args.model} pp={args.pp}, one request at a time, medians of {args.repeat}")
        print("| prompt tokens | TTFT | first token -> answer, no hand-off | with the hand-off | wait |")
        print("|---|---|---|---|---|")
        for n in (512, 1600):
            after, ttft = {False: [], True: []}, []
            for _ in range(args.repeat):
                for export in (False, True):
                    prompt = [rng.randrange(engine.vocab_size) for _ in range(n)]
                    t0 = time.perf_counter()
                    r = engine.submit(prompt, kv_transfer=export).result()
                    after[export].append(time.perf_counter() - t0 - r.ttft_s)
                    ttft.append(r.ttft_s)
            off, on = statistics.median(after[False]) * 1e3, statistics.median(after[True]) * 1e3
            print(f"| {n:,} | {statistics.median(ttft) * 1e3:,.0f} ms | {off:.1f} ms | {on:.1f} ms | "
                  f"{on - off:.1f} ms |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--micro", action="store_true", help="one stage's copy and write alone")
    ap.add_argument("--answer", action="store_true", help="first token -> answer, with and without the hand-off")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[8, 64])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--store-gib", type=float, default=2.0, help="the store's size cap (oldest dropped)")
    ap.add_argument("--transport", type=lambda s: s.split(","), default=["directory", "mooncake"],
                    help="the closed loop's transports, comma-separated (directory, mooncake)")
    args = ap.parse_args()
    if args.micro:
        micro()
    elif args.answer:
        answer_wait(args)
    else:
        closed_loop(args)


if __name__ == "__main__":
    main()
