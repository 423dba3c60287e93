"""Time to first token through the P/D path (`wavepp route` -> `wavepp serve` -> vLLM with the
WavePPConnector), over each KV transport, against vLLM's server alone, on the same prompts.

    python benchmarks/bench_pd_ttft.py --prompts 16 --prefix-len 1024 --suffix-len 64 --concurrency 1,8

Starts two wavepp prefill servers (PP = 2; one with the directory store, one with
`--kv-transport mooncake`), one vLLM decode server with the connector (its extra config names the
store, so it serves both; prefix caching off: it computes what it does not load; vLLM's default
block size), a router in front of each prefill server, and a second vLLM server alone with its
prefix caching on (its best). Each prompt goes, with max_tokens 1, through each router, straight
to the decode server, and to vLLM alone, the targets interleaved; at concurrency c, c prompts at
once to one target, then the same c to the next. Prompts share prefixes in 4 groups.

Where the router path's time goes (`--breakdown`, one at a time, after the runs above): per
prompt, the prefill server alone with do_remote_decode (wavepp's prefill and its hand-off
answer), then the decode server alone with those params (vLLM's pull, load and one step); the
router's total less those two is its two hops.

`--async-load`: the decode server's connector pulls off vLLM's step (`"async_load": true`). After
the runs, each pull's wait, pull and load times as the decode server's /metrics has them
(vllm:wavepp_kv_*: means over every pull from the stages, Mooncake's path only).
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from wavepp.bench.http import wait_until_healthy  # noqa: E402
from wavepp.model_store import resolve_model  # noqa: E402
from wavepp.runtime.launch import free_port  # noqa: E402

VLLM = str(ROOT / ".venv-vllm" / "bin" / "python")
LABELS = {
    "route-mooncake": "router -> wavepp PP = 2 -> vLLM, Mooncake transfer engine",
    "route-directory": "router -> wavepp PP = 2 -> vLLM, directory store",
    "alone": "vLLM alone, prefix caching on",
    "decode": "vLLM alone, prefix caching off (the decode server)",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--suffix-len", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--breakdown", action="store_true", help="also time the path's two legs")
    ap.add_argument("--async-load", action="store_true", help="the connector pulls off vLLM's step")
    args = ap.parse_args()
    model = str(resolve_model("smollm2"))
    rng = random.Random(0)
    prefixes = [[rng.randrange(100, 40000) for _ in range(args.prefix_len)] for _ in range(4)]

    def fresh_prompts():
        return [prefixes[i % 4] + [rng.randrange(100, 40000) for _ in range(args.suffix_len)]
                for i in range(args.prompts)]

    names = ("prefill-directory", "prefill-mooncake", "decode", "route-directory", "route-mooncake", "alone")
    ports = {name: free_port() for name in names}
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    procs = {}
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as store:
        config = {"kv_connector": "WavePPConnector", "kv_connector_module_path": "wavepp.connectors.vllm",
                  "kv_role": "kv_consumer",
                  "kv_connector_extra_config": {"store": store, "async_load": args.async_load}}
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), VLLM_CPU_NUM_OF_RESERVED_CPU="0",
                   VLLM_CPU_OMP_THREADS_BIND="0-1", VLLM_CPU_KVCACHE_SPACE="1")
        serve = [sys.executable, "-m", "wavepp.cli", "serve", "--model", model, "--pp", "2", "--dtype", args.dtype]
        try:
            procs["prefill-directory"] = subprocess.Popen(
                serve + ["--port", str(ports["prefill-directory"]), "--kv-store", store], **quiet)
            procs["prefill-mooncake"] = subprocess.Popen(
                serve + ["--port", str(ports["prefill-mooncake"]), "--kv-transport", "mooncake",
                         "--kv-host", "127.0.0.1"], **quiet)
            procs["decode"] = subprocess.Popen(
                [VLLM, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(ports["decode"]),
                 "--dtype", args.dtype, "--no-enable-prefix-caching", "--max-model-len", "4096",
                 "--kv-transfer-config", json.dumps(config)], env=env, **quiet)
            for kind in ("directory", "mooncake"):
                procs[f"route-{kind}"] = subprocess.Popen(
                    [sys.executable, "-m", "wavepp.cli", "route", "--prefill", url[f"prefill-{kind}"],
                     "--decode", url["decode"], "--port", str(ports[f"route-{kind}"])], **quiet)
            procs["alone"] = subprocess.Popen(
                [VLLM, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(ports["alone"]),
                 "--dtype", args.dtype, "--max-model-len", "4096"], env=env, **quiet)
            for name, proc in procs.items():
                wait_until_healthy(url[name], proc, timeout_s=900)
            targets = ("route-mooncake", "route-directory", "alone", "decode")
            times = {(t, c): [] for t in targets for c in args.concurrency}

            def post(target, prompt, **extra):
                with httpx.Client(timeout=600) as client:
                    t0 = time.perf_counter()
                    r = client.post(f"{url[target]}/v1/completions",
                                    json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0,
                                          **extra})
                    r.raise_for_status()
                    return time.perf_counter() - t0, r.json()

            for target in targets:  # one warm-up request each
                post(target, prefixes[0][:64])
            for c in args.concurrency:
                prompts = fresh_prompts()
                with ThreadPoolExecutor(c) as pool:
                    for i in range(0, len(prompts), c):
                        batch = prompts[i:i + c]
                        for target in targets:
                            times[(target, c)] += [t for t, _ in pool.map(lambda p: post(target, p), batch)]
            legs = {"prefill": [], "decode": [], "route": []}
            if args.breakdown:
                # two prompts of the same group each time: each finds its prefix cached, its suffix new
                for prompt, other in zip(fresh_prompts(), fresh_prompts()):
                    t_route, _ = post("route-mooncake", other)
                    t_prefill, answer = post("prefill-mooncake", prompt,
                                             kv_transfer_params={"do_remote_decode": True})
                    t_decode, _ = post("decode", prompt, kv_transfer_params=answer["kv_transfer_params"])
                    legs["route"].append(t_route)
                    legs["prefill"].append(t_prefill)
                    legs["decode"].append(t_decode)
            with httpx.Client(timeout=60) as client:
                pulls = pull_means(client.get(f"{url['decode']}/metrics").text)
        finally:
            for proc in procs.values():
                proc.terminate()
            for proc in procs.values():
                proc.wait(60)
    print(f"SmolLM2 {args.dtype}, {args.prompts} prompts of {args.prefix_len} + {args.suffix_len} tokens in "
          f"4 groups, max_tokens 1, vLLM's default block size, pulls "
          f"{'off the step (async_load)' if args.async_load else 'inside the step'}")
    print("| path | concurrency | TTFT p50 ms | min ms | max ms |\n|---|---|---|---|---|")
    for c in args.concurrency:
        for target in targets:
            t = times[(target, c)]
            print(f"| {LABELS[target]} | {c} | {statistics.median(t) * 1e3:,.0f} | {min(t) * 1e3:,.0f} | "
                  f"{max(t) * 1e3:,.0f} |")
    for c in args.concurrency:
        alone = statistics.median(times[("alone", c)])
        for kind in ("mooncake", "directory"):
            print(f"c = {c}: router ({kind}) / vLLM alone (prefix caching on): "
                  f"{statistics.median(times[(f'route-{kind}', c)]) / alone:.2f}x")
    print(f"\nthe decode server's pulls (its /metrics): {pulls['count']:.0f}, means: wait "
          f"{pulls['pull_wait']:.1f} ms, pull {pulls['pull']:.1f} ms, load {pulls['load']:.1f} ms")
    if args.breakdown:
        med = {k: statistics.median(v) * 1e3 for k, v in legs.items()}
        print("\n| the router path (Mooncake), one at a time | p50 ms |\n|---|---|")
        print(f"| wavepp prefill + hand-off answer (prefill server alone) | {med['prefill']:,.0f} |")
        print(f"| vLLM: pull + load + one step (decode server alone, with the params) | {med['decode']:,.0f} |")
        print(f"| the router's two hops (the rest) | {med['route'] - med['prefill'] - med['decode']:,.0f} |")
        print(f"| router path, total | {med['route']:,.0f} |")


def pull_means(metrics: str) -> dict[str, float]:
    """Mean ms of each of the connector's pull histograms, and their count, from /metrics text."""
    sums: dict[str, float] = {}
    for line in metrics.splitlines():
        timed = "_seconds_sum{" in line or "_seconds_count{" in line
        if line.startswith("vllm:wavepp_kv_") and timed:
            name = line.split("{", 1)[0][len("vllm:wavepp_kv_"):]
            sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    count = sums.get("pull_seconds_count", 0.0)
    out = {"count": count}
    for key in ("pull_wait", "pull", "load"):
        out[key] = sums.get(f"{key}_seconds_sum", 0.0) / count * 1e3 if count else float("nan")
    return out


if __name__ == "__main__":
    main()
