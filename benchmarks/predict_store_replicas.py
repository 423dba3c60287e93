"""The simulator's prediction of `bench_store_replicas.py`'s runs, from what those runs measured.

    python benchmarks/predict_store_replicas.py --from /tmp/store_replicas.json

The machine: `CpuHardware` (sim/studies/calibrate.py) fitted to the stage samples of the runs
without a tier (each replica's waves, `GET /debug/stage_samples`), the hop between stages from
their wave spans, and a stage's fetch from the store at the per-block load time the store runs
measured (`wavepp_kv_tier_store_load_seconds_total` over the blocks it loaded). Then the same
prompts, closed loop at the same concurrency, through two simulated replicas routed by the
router's own code (sim/studies/replicas.py `run_replicas_closed`), sharing a simulated store
of the stages' lent segments, or each stage with its host tier, copying at the rate a
block's copy runs here (timed), for every (tier, routing) the runs had. The fitted costs carry
what the runs had: both replicas' stage i share CPU i, so a stage's time is its time beside
the other replica's stage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from wavepp.sim import CpuHardware, StageSample  # noqa: E402
from wavepp.sim.core.shared_store import SimSharedStore  # noqa: E402
from wavepp.sim.studies.calibrate import link_latency_s  # noqa: E402
from wavepp.sim.studies.replicas import run_replicas_closed  # noqa: E402


def stage_block_bytes(config: dict, num_stages: int, block_size: int, dtype_bytes: int = 2):
    """Each stage's KV bytes of one block under the even layer split (what a store entry holds,
    its 20-byte header aside)."""
    layers = config["num_hidden_layers"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_layer = 2 * config["num_key_value_heads"] * head_dim * block_size * dtype_bytes
    base, extra = divmod(layers, num_stages)
    return [per_layer * (base + (1 if i < extra else 0)) for i in range(num_stages)]


def timed_copy_bytes_s(config: dict, num_stages: int, block_size: int, repeat: int = 400) -> float:
    """Bytes/s of copying one block out of a stage's pool into a host slot and back, as the
    runtime's host tier does (runtime/host_kv.py: `pool[:, block]`, every layer of the stage),
    timed here: the host link of a CPU stage."""
    layers = config["num_hidden_layers"] // num_stages
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    width = config["num_key_value_heads"] * head_dim
    pool = torch.randn(layers, 448, block_size, 2 * width).to(torch.bfloat16)
    host = torch.zeros(64, layers, block_size, 2 * width, dtype=torch.bfloat16)  # touched
    start = time.perf_counter()
    for i in range(repeat):
        host[i % 64].copy_(pool[:, (7 * i) % 448])
        pool[:, (11 * i) % 448].copy_(host[(i + 1) % 64])
    seconds = time.perf_counter() - start
    return 2 * repeat * host[0].numel() * host.element_size() / seconds


def fit_hardware(
    rows: list[dict], num_stages: int, block_bytes: list[int], host_link_bytes_s: float
) -> CpuHardware:
    """Stage costs from the runs without a tier; the hop from their wave spans (the median of
    each replica's `link_latency_s`); the store link from the store runs' load time per
    block."""
    samples, hops = [], []
    for row in rows:
        if row["tier"] != "none":
            continue
        for replica in row["replica_samples"]:
            samples += [
                StageSample(s, tuple(map(tuple, ch)), sec)
                for s, ch, sec in replica["stage_samples"]
            ]
            hops.append(link_latency_s(replica["wave_spans"]))
    if not samples:
        raise SystemExit("no runs without a tier to fit the machine to (--tier none,store)")
    loads = [r["store_load_s"] / r["store_hit_blocks"] for r in rows if r.get("store_hit_blocks")]
    per_block = statistics.median(loads) if loads else 0.0
    link = max(0.0, statistics.median(hops)) if hops else 0.0
    return CpuHardware.fit(
        samples,
        num_stages=num_stages,
        transfer_latency_s=link,
        result_latency_s=link,
        host_link_bytes_s=host_link_bytes_s,
        store_link_bytes_s=max(block_bytes) / per_block if per_block else 0.0,
    )


def predict(data: dict) -> list[dict]:
    """One predicted row per (tier, routing) of the runs, beside the runs' medians."""
    rows, meta = data["rows"], data["meta"]
    bs, stages = meta["block_size"], meta["num_stages"]
    block_bytes = stage_block_bytes(meta["model_config"], stages, bs)
    host_link = timed_copy_bytes_s(meta["model_config"], stages, bs)
    print(f"host link (a block's copy, timed here): {host_link / 1e9:.2f} GB/s")
    hardware = fit_hardware(rows, stages, block_bytes, host_link)
    out = []
    for tier, routing in dict.fromkeys((r["tier"], r["routing"]) for r in rows):
        store = None
        if tier == "store":
            store = SimSharedStore(int(meta["store_gib"] * 2**30))
        sims = [
            hardware.build(
                "wavepp",
                stage_num_blocks=meta["stage_num_blocks"],
                block_size=bs,
                host_kv_bytes=int(meta["host_kv_gib"] * 2**30) if tier == "host" else 0,
                store=store,
                stage_block_bytes=block_bytes if tier != "none" else (),
            )
            for _ in range(meta["replicas"])
        ]
        sim = run_replicas_closed(
            sims, data["prompts"], concurrency=meta["concurrency"], routing=routing, block_size=bs
        )
        mine = [r for r in rows if r["tier"] == tier and r["routing"] == routing]
        out.append(
            {
                "tier": tier,
                "routing": routing,
                "hit_rate": statistics.median(r["hit_rate"] for r in mine),
                "sim_hit_rate": sim["hit_rate"],
                "input_tok_s": statistics.median(r["input_tok_s"] for r in mine),
                "sim_input_tok_s": sim["input_tok_s"],
            }
        )
    return out


def print_table(predicted: list[dict]) -> None:
    print("\n| tier | routing | hit: run / sim | input tok/s: run / sim | sim / run |")
    print("|---|---|---|---|---|")
    for p in predicted:
        print(
            f"| {p['tier']} | {p['routing']} | {p['hit_rate']:.1%} / {p['sim_hit_rate']:.1%} | "
            f"{p['input_tok_s']:,.0f} / {p['sim_input_tok_s']:,.0f} | "
            f"{p['sim_input_tok_s'] / p['input_tok_s']:.2f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="path", required=True, help="bench_store_replicas.py --json")
    args = ap.parse_args()
    print_table(predict(json.loads(Path(args.path).read_text())))


if __name__ == "__main__":
    main()
