"""What the `cache` routing decision costs, against the prefill it routes.

    python benchmarks/bench_route.py --prompt-len 1024 --repeat 30

Starts `wavepp serve --pp 2` (SmolLM2, bf16) and times, on prompts of shared prefixes (each new
suffix, its prefix cached): POST /v1/cache_query (what `wavepp route --routing cache` asks each
replica before a request; the replicas are asked at once, so one query is the decision's
latency) and POST /v1/completions with max_tokens 1 (the prefill itself), interleaved; medians.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from wavepp.bench.http import wait_until_healthy  # noqa: E402
from wavepp.model_store import resolve_model  # noqa: E402
from wavepp.runtime.launch import free_port  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--suffix-len", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "wavepp.cli", "serve", "--model", str(resolve_model("smollm2")),
         "--pp", "2", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rng = random.Random(0)
    prefix = [rng.randrange(100, 40000) for _ in range(args.prompt_len - args.suffix_len)]
    query, prefill = [], []
    try:
        wait_until_healthy(url, proc, timeout_s=600)
        with httpx.Client(timeout=600) as client:
            client.post(f"{url}/v1/completions", json={"prompt": prefix, "max_tokens": 1})
            for _ in range(args.repeat):
                ids = prefix + [rng.randrange(100, 40000) for _ in range(args.suffix_len)]
                t0 = time.perf_counter()
                q = client.post(f"{url}/v1/cache_query", json={"prompt": ids}).json()
                t1 = time.perf_counter()
                client.post(f"{url}/v1/completions", json={"prompt": ids, "max_tokens": 1})
                t2 = time.perf_counter()
                query.append(t1 - t0)
                prefill.append(t2 - t1)
        assert q["cached_tokens"] >= len(prefix) // 16 * 16 - 16, q
    finally:
        proc.terminate()
        proc.wait(60)
    qm, pm = statistics.median(query) * 1e3, statistics.median(prefill) * 1e3
    print(f"SmolLM2 bf16 PP = 2, prompts of {args.prompt_len} tokens ({args.suffix_len} new), "
          f"medians of {args.repeat}")
    print("| step | p50 | min | max |\n|---|---|---|---|")
    print(f"| POST /v1/cache_query (the decision) | {qm:.2f} ms | {min(query) * 1e3:.2f} ms | "
          f"{max(query) * 1e3:.2f} ms |")
    print(f"| POST /v1/completions, max_tokens 1 (the prefill) | {pm:.1f} ms | "
          f"{min(prefill) * 1e3:.1f} ms | {max(prefill) * 1e3:.1f} ms |")
    print(f"the decision is {qm / pm:.1%} of the prefill")


if __name__ == "__main__":
    main()
