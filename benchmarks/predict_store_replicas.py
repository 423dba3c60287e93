"""The simulator's prediction of `bench_store_replicas.py`'s runs, from what those runs measured.

    python benchmarks/predict_store_replicas.py --from /tmp/store_replicas.json

The machine: `CpuHardware` (sim/studies/calibrate.py) fitted to the stage samples of the runs
without a tier (each replica's waves, `GET /debug/stage_samples`), the hop between stages from
their wave spans, and a stage's fetch from the store at the per-block load time the store runs
measured (`wavepp_kv_tier_store_load_seconds_total` over the blocks it loaded). Then the same
prompts, closed loop at the same concurrency, through two simulated replicas routed by the
router's own code (sim/studies/replicas.py `run_replicas_closed`), sharing a simulated store
of the stages' lent segments, for every (tier, routing) the runs had. The fitted costs carry
what the runs had: both replicas' stage i share CPU i, so a stage's time is its time beside
the other replica's stage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from wavepp.sim import CpuHardware, StageSample  # noqa: E402
from wavepp.sim.core.shared_store import SimSharedStore  # noqa: E402
from wavepp.sim.studies.replicas import run_replicas_closed  # noqa: E402


def stage_block_bytes(config: dict, num_stages: int, block_size: int, dtype_bytes: int = 2):
    """Each stage's KV bytes of one block under the even layer split (what a store entry holds,
    its 20-byte header aside)."""
    layers = config["num_hidden_layers"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_layer = 2 * config["num_key_value_heads"] * head_dim * block_size * dtype_bytes
    base, extra = divmod(layers, num_stages)
    return [per_layer * (base + (1 if i < extra else 0)) for i in range(num_stages)]


def fit_hardware(rows: list[dict], num_stages: int, block_bytes: list[int]) -> CpuHardware:
    """Stage costs from the runs without a tier; the hop from their wave spans; the store link
    from the store runs' load time per block."""
    samples, hops = [], []
    for row in rows:
        if row["tier"] != "none":
            continue
        for replica in row["replica_samples"]:
            samples += [
                StageSample(s, tuple(map(tuple, ch)), sec)
                for s, ch, sec in replica["stage_samples"]
            ]
            hops += _hops(replica["wave_spans"])
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
        store_link_bytes_s=max(block_bytes) / per_block if per_block else 0.0,
    )


def _hops(spans: list[list]) -> list[float]:
    """Stage 0's end to stage 1's start of each wave both ran."""
    ends = {w: end for stage, w, _, end in spans if stage == 0}
    return [start - ends[w] for stage, w, start, _ in spans if stage == 1 and w in ends]


def predict(data: dict) -> list[dict]:
    """One predicted row per (tier, routing) of the runs, beside the runs' medians."""
    rows, meta = data["rows"], data["meta"]
    bs, stages = meta["block_size"], meta["num_stages"]
    block_bytes = stage_block_bytes(meta["model_config"], stages, bs)
    hardware = fit_hardware(rows, stages, block_bytes)
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
                store=store,
                stage_block_bytes=block_bytes if store is not None else (),
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
