"""Two prefill replicas behind `wavepp route`, with and without the KV tier they share
(Mooncake Store): hit rate against the ideal of one unbounded cache, and input tokens/s.

    python benchmarks/bench_store_replicas.py --routing round-robin,cache --tier none,store \\
        --repeat 2 --predict

Each configuration starts from nothing (a fresh `mooncake_master` with the store, two `wavepp
serve --pp 2` replicas of SmolLM2 bf16 with small stage pools, the router) and sends the
workload through the router, `--concurrency` requests at a time (serve/loadgen.py); the
configurations run interleaved, `--repeat` rounds. The workload is `short-suffix`: groups of a
long prefix, each followed by a suffix, taken in turn (a cycle); with an odd number of groups
round-robin sends every group to both replicas. Prints one line per run and a median table;
with `--predict`, the simulator's prediction of each configuration beside it
(predict_store_replicas.py: a CPU machine fitted to the runs without a tier).

One replica with and without its host tier (`--host-kv-gib` a stage), the same way:

    python benchmarks/bench_store_replicas.py --replicas 1 --routing round-robin \
        --tier none,host --num-groups 8 --repeat 2 --predict
"""

from __future__ import annotations

import argparse
import json
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
from wavepp.serve.loadgen import run_load  # noqa: E402
from wavepp.workloads import WorkloadOptions, workload_from_options  # noqa: E402


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def _master(log_dir: Path) -> tuple[subprocess.Popen, str, str]:
    rpc, http, metrics = free_port(), free_port(), free_port()  # 9003, the default, may be taken
    binary = Path(sys.executable).parent / "mooncake_master"
    proc = _start(
        [
            str(binary),
            "-rpc_port",
            str(rpc),
            "-enable_http_metadata_server=true",
            "-http_metadata_server_port",
            str(http),
            "-metrics_port",
            str(metrics),
        ],
        log_dir / "master.log",
    )
    time.sleep(1.0)
    return proc, f"127.0.0.1:{rpc}", f"http://127.0.0.1:{http}/metadata"


def run_one(args, tier: str, routing: str, prompts, log_dir: Path) -> dict:
    """One configuration from nothing: its processes, the load through the router, its row."""
    procs, replicas = [], []
    model = str(resolve_model("smollm2"))
    try:
        store = []
        if tier == "store":
            master, address, metadata = _master(log_dir)
            procs.append(master)
            store = [
                "--kv-tier",
                "mooncake-store",
                "--kv-tier-master",
                address,
                "--kv-tier-metadata",
                metadata,
                "--kv-tier-segment-gib",
                str(args.segment_gib),
            ]
        elif tier == "host":
            store = ["--host-kv-gib", str(args.host_kv_gib)]
        elif tier != "none":
            raise SystemExit(f"--tier: none, host or store, got {tier!r}")
        for i in range(args.replicas):
            port = free_port()
            procs.append(
                _start(
                    [
                        sys.executable,
                        "-m",
                        "wavepp.cli",
                        "serve",
                        "--model",
                        model,
                        "--pp",
                        "2",
                        "--port",
                        str(port),
                        "--stage-num-blocks",
                        args.stage_num_blocks,
                        "--debug",
                        *store,
                    ],
                    log_dir / f"replica{i}.{tier}.{routing}.log",
                )
            )
            replicas.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(replicas, procs[-args.replicas :]):
            wait_until_healthy(url, proc, timeout_s=900)
        port = free_port()
        router = f"http://127.0.0.1:{port}"
        procs.append(
            _start(
                [
                    sys.executable,
                    "-m",
                    "wavepp.cli",
                    "route",
                    "--prefill",
                    ",".join(replicas),
                    "--routing",
                    routing,
                    "--port",
                    str(port),
                ],
                log_dir / f"route.{tier}.{routing}.log",
            )
        )
        wait_until_healthy(router, procs[-1], timeout_s=120)
        with httpx.Client(timeout=600) as client:  # warm each replica (an unrelated prompt)
            for url in replicas:
                client.post(f"{url}/v1/completions", json={"prompt": [7] * 64, "max_tokens": 1})
        report = run_load(router, prompts, concurrency=args.concurrency, timeout_s=900)
        if report.num_ok != len(prompts):
            raise RuntimeError(f"{tier}/{routing}: {report.errors[:3]}")
        latencies = sorted(report.latencies_s)
        tiers = _scrape_tiers(replicas)
        with httpx.Client(timeout=120) as client:
            samples = [client.get(f"{url}/debug/stage_samples").json() for url in replicas]
        return {
            **tiers,
            "replica_samples": samples,
            "tier": tier,
            "routing": routing,
            "hit_rate": report.cached_tokens / report.prompt_tokens,
            "input_tok_s": report.prompt_tokens / report.wall_s,
            "ttft_p50_ms": 1e3 * statistics.median(latencies),
            "computed_tokens": report.prompt_tokens - report.cached_tokens,
        }
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def _scrape_tiers(replicas: list[str]) -> dict:
    """From the replicas' /metrics, summed over replicas and stages: the store's load time
    and the blocks it loaded, the stages' busy time (what a load costs against computing)."""
    totals = {"store_load_s": 0.0, "store_hit_blocks": 0.0, "busy_s": 0.0}
    with httpx.Client(timeout=60) as client:
        for url in replicas:
            for line in client.get(f"{url}/metrics").text.splitlines():
                name, _, value = line.rpartition(" ")
                if name.startswith("wavepp_kv_tier_store_load_seconds_total"):
                    totals["store_load_s"] += float(value)
                elif name.startswith("wavepp_kv_tier_hit_blocks_total") and 'tier="store"' in name:
                    totals["store_hit_blocks"] += float(value)
                elif name.startswith("wavepp_stage_busy_seconds_total"):
                    totals["busy_s"] += float(value)
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routing", default="round-robin,cache")
    ap.add_argument("--tier", default="none,store")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--num-groups", type=int, default=9)
    ap.add_argument("--prefix-len", type=int, default=1536)
    ap.add_argument("--suffix-len", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--stage-num-blocks", default="448,448")
    ap.add_argument("--segment-gib", type=float, default=0.25)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--host-kv-gib", type=float, default=0.5, help="a stage's, --tier host")
    ap.add_argument("--log-dir", default="/tmp/bench_store_replicas")
    ap.add_argument("--json", default=None, help="write the runs (and what --predict needs)")
    ap.add_argument(
        "--predict",
        action="store_true",
        help="then the simulator's prediction of every configuration (predict_store_replicas.py)",
    )
    args = ap.parse_args()
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    workload = workload_from_options(
        "short-suffix",
        WorkloadOptions(
            num_requests=args.num_requests,
            prompt_len=0,
            prefix_len=args.prefix_len,
            suffix_len=args.suffix_len,
            num_groups=args.num_groups,
            common={"vocab_size": 49152},
        ),
    )
    print(f"workload: {workload.name}, ideal hit rate {workload.ideal_hit_rate:.1%}", flush=True)
    rows = []
    for rep in range(args.repeat):
        for tier in args.tier.split(","):
            for routing in args.routing.split(","):
                row = run_one(args, tier, routing, workload.prompts, log_dir)
                row["repeat"] = rep
                rows.append(row)
                print(
                    f"  {tier:<5} {routing:<11} run {rep + 1}: hit {row['hit_rate']:.1%}, "
                    f"{row['input_tok_s']:,.0f} input tok/s, TTFT p50 {row['ttft_p50_ms']:,.0f} ms",
                    flush=True,
                )
    print("\n| tier | routing | hit / ideal | input tok/s (median) | TTFT p50 ms |")
    print("|---|---|---|---|---|")
    for tier in args.tier.split(","):
        for routing in args.routing.split(","):
            mine = [r for r in rows if r["tier"] == tier and r["routing"] == routing]
            print(
                f"| {tier} | {routing} | "
                f"{statistics.median(r['hit_rate'] for r in mine):.1%} / "
                f"{workload.ideal_hit_rate:.1%} | "
                f"{statistics.median(r['input_tok_s'] for r in mine):,.0f} | "
                f"{statistics.median(r['ttft_p50_ms'] for r in mine):,.0f} |"
            )
    none = [r for r in rows if r["tier"] == "none"]
    store = [r for r in rows if r["tier"] == "store" and r["store_hit_blocks"]]
    if none and store:  # a stage's block: 16 tokens of its layers (each stage has half)
        # busy time summed over 2 stages a replica: each computed token ran on both
        compute = statistics.median(16 * r["busy_s"] / (2 * r["computed_tokens"]) for r in none)
        load = statistics.median(r["store_load_s"] / r["store_hit_blocks"] for r in store)
        print(
            f"\na stage's block: computed in {1e3 * compute:.2f} ms (busy time per computed "
            f"block, no tier), loaded from the store in {1e3 * load:.2f} ms (fetch and check)"
        )
    data = {"meta": _meta(args), "rows": rows, "prompts": workload.prompts}
    if args.json:
        Path(args.json).write_text(json.dumps(data))
    if args.predict:
        from predict_store_replicas import predict, print_table

        print_table(predict(data))


def _meta(args) -> dict:
    """What the simulator needs to rebuild the runs' setting."""
    config = json.loads((resolve_model("smollm2") / "config.json").read_text())
    return {
        "model_config": config,
        "num_stages": 2,
        "replicas": args.replicas,
        "host_kv_gib": args.host_kv_gib,
        "block_size": 16,
        "stage_num_blocks": [int(n) for n in args.stage_num_blocks.split(",")],
        "concurrency": args.concurrency,
        "store_gib": 2 * args.replicas * args.segment_gib,  # every stage process lends one
    }


if __name__ == "__main__":
    main()
