"""Soak `wavepp serve`: many small requests over loopback; memory stays bounded, latency flat.

    .venv/bin/python benchmarks/serve_soak.py [--requests 20000] [--concurrency 16] [--window 2000]
                                              [--model DIR] [--pp 2]

Starts `wavepp serve` on a free 127.0.0.1 port (a tiny random Llama unless --model), sends
`--requests` prompts (8 groups sharing 48-token prefixes, 4-24-token suffixes) in windows of
`--window`, and after each window prints the window's latency p50 / p99, its throughput, and
the RSS of the server process and of every stage process. At the end: RSS growth from the end
of the first window (the cache and allocator warm up there) to the end, and latency drift (the
last window's p50 over the first's). It stops by itself and stops the server with SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from wavepp.runtime.launch import free_port
from wavepp.serve.loadgen import group_prompts, run_load


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"multiprocessing-fork" in cmd:
                out.append(int(entry.name))
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--window", type=int, default=2000)
    ap.add_argument("--model", default=None)
    ap.add_argument("--pp", type=int, default=2)
    args = ap.parse_args()

    model = args.model
    if model is None:
        from wavepp.random_checkpoint import make_model
        model = str(make_model(Path(tempfile.mkdtemp(prefix="wavepp-soak-")) / "tiny", arch="llama",
                               num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2,
                               intermediate_size=128, vocab_size=256, max_position_embeddings=512, seed=5))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "wavepp.cli", "serve", "--model", model, "--pp", str(args.pp),
                             "--port", str(port), "--max-waiting", "100000"],
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                print("the server did not start", file=sys.stderr)
                return 1
            time.sleep(0.3)
        pids = [proc.pid] + children(proc.pid)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores; pp={args.pp}; "
              f"{args.requests} requests, concurrency {args.concurrency}")
        print(f"{'done':>7} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>7}  RSS MiB (server, stages...)")
        vocab = 256
        prompts = group_prompts(args.requests, vocab_size=vocab, seed=1)
        rows = []
        for start in range(0, args.requests, args.window):
            window = prompts[start:start + args.window]
            rep = run_load(url, window, concurrency=args.concurrency, seed=start)
            if rep.num_errors or rep.num_rejected:
                print(f"errors: {rep.errors[:3]} rejected {rep.num_rejected}", file=sys.stderr)
                return 1
            lat = sorted(rep.latencies_s)
            p50, p99 = statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]
            rss = [rss_mib(p) for p in pids]
            rows.append((p50, rss))
            print(f"{start + len(window):>7} {1e3 * p50:>8.1f} {1e3 * p99:>8.1f} {len(window) / rep.wall_s:>7.0f}  "
                  + ", ".join(f"{r:.0f}" for r in rss), flush=True)
        first_rss, last_rss = rows[0][1], rows[-1][1]
        growth = [b - a for a, b in zip(first_rss, last_rss)]
        print("RSS growth after the first window (MiB): " + ", ".join(f"{g:+.1f}" for g in growth))
        print(f"latency drift: last window p50 / first window p50 = {rows[-1][0] / rows[0][0]:.2f}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
