"""Time to first token through the P/D path (`wavepp route` -> `wavepp serve --kv-store` -> vLLM
with the WavePPConnector) against vLLM's server alone, on the same prompts, one at a time.

    python benchmarks/bench_pd_ttft.py --prompts 16 --prefix-len 1024 --suffix-len 64

Starts the three processes (vLLM from `.venv-vllm`) and a second vLLM server alone with its
prefix caching on (its best), sends each prompt with max_tokens 1 through the router, straight to
the decode server (prefix caching off there: it computes what it does not load) and to vLLM alone,
interleaved, and prints the medians. Prompts share prefixes in 4 groups.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from wavepp.bench.http import wait_until_healthy   # noqa: E402
from wavepp.runtime.launch import free_port        # noqa: E402
from wavepp.model_store import resolve_model             # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--suffix-len", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    model = str(resolve_model("smollm2"))
    rng = random.Random(0)
    prefixes = [[rng.randrange(100, 40000) for _ in range(args.prefix_len)] for _ in range(4)]
    prompts = [prefixes[i % 4] + [rng.randrange(100, 40000) for _ in range(args.suffix_len)]
               for i in range(args.prompts)]
    ports = {name: free_port() for name in ("prefill", "decode", "route", "alone")}
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    procs = []
    with tempfile.TemporaryDirectory() as store:
        config = {"kv_connector": "WavePPConnector", "kv_connector_module_path": "wavepp.connectors.vllm",
                  "kv_role": "kv_consumer", "kv_connector_extra_config": {"store": store}}
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), VLLM_CPU_NUM_OF_RESERVED_CPU="0",
                   VLLM_CPU_OMP_THREADS_BIND="0-1", VLLM_CPU_KVCACHE_SPACE="1")
        try:
            procs.append(subprocess.Popen([sys.executable, "-m", "wavepp.cli", "serve", "--model", model, "--pp", "2",
                                           "--dtype", args.dtype, "--port", str(ports["prefill"]),
                                           "--kv-store", store], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            procs.append(subprocess.Popen([str(ROOT / ".venv-vllm" / "bin" / "python"), "-m",
                                           "vllm.entrypoints.openai.api_server", "--model", model, "--port",
                                           str(ports["decode"]), "--dtype", args.dtype, "--block-size", "32",
                                           "--no-enable-prefix-caching", "--max-model-len", "4096",
                                           "--kv-transfer-config", json.dumps(config)], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            procs.append(subprocess.Popen([sys.executable, "-m", "wavepp.cli", "route", "--prefill", url["prefill"],
                                           "--decode", url["decode"], "--port", str(ports["route"])],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            procs.append(subprocess.Popen([str(ROOT / ".venv-vllm" / "bin" / "python"), "-m",
                                           "vllm.entrypoints.openai.api_server", "--model", model, "--port",
                                           str(ports["alone"]), "--dtype", args.dtype, "--max-model-len", "4096"],
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for name, proc in zip(("prefill", "decode", "route", "alone"), procs):
                wait_until_healthy(url[name], proc, timeout_s=900)
            times = {"route": [], "decode": [], "alone": []}
            with httpx.Client(timeout=600) as client:
                for target in times:                 # one warm-up request each
                    client.post(f"{url[target]}/v1/completions", json={"prompt": prompts[0][:64], "max_tokens": 1})
                for prompt in prompts:               # interleaved, one at a time
                    for target in times:
                        t0 = time.perf_counter()
                        r = client.post(f"{url[target]}/v1/completions",
                                        json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
                        r.raise_for_status()
                        times[target].append(time.perf_counter() - t0)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(60)
    route, alone = statistics.median(times["route"]), statistics.median(times["alone"])
    print(f"SmolLM2 {args.dtype}, {args.prompts} prompts of {args.prefix_len} + {args.suffix_len} tokens in 4 groups, "
          f"one at a time, max_tokens 1")
    print("| path | TTFT p50 ms | min ms | max ms |\n|---|---|---|---|")
    for name, label in (("route", "router -> wavepp PP = 2 -> vLLM loading the KV"),
                        ("alone", "vLLM alone, prefix caching on"),
                        ("decode", "vLLM alone, prefix caching off (the decode server)")):
        print(f"| {label} | {statistics.median(times[name]) * 1e3:,.0f} | {min(times[name]) * 1e3:,.0f} | "
              f"{max(times[name]) * 1e3:,.0f} |")
    print(f"router / vLLM alone (prefix caching on): {route / alone:.2f}x")


if __name__ == "__main__":
    main()
