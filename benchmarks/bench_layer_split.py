"""The layer split by count against `layer_split="auto"` on the real pipeline: per-stage busy
time and input tok/s, on random-weight checkpoints at the released models' layer patterns.

    python benchmarks/bench_layer_split.py                       # both models, PP 2 and 3
    python benchmarks/bench_layer_split.py --model kimi --pp 2 --repeat 5 --json out.json
    python benchmarks/bench_layer_split.py --sim                 # the simulator's splits instead

Models (hidden 256; every width in the released model's proportions, scaled down):
    deepseek   DeepSeek-V3's 61 layers, the first 3 dense (MLP 9 x the expert width, as released:
               8 routed experts + 1 shared of the same FLOPs), then MoE (32 experts, top 8)
    kimi       Kimi-Linear's 27 layers: KDA but MLA at layers 3, 7, 11, 15, 19, 23, 26; layer 0
               dense, the rest MoE (32 experts, top 8)

For each (model, PP), `--repeat` rounds start an engine of each split in turn (auto measures
each layer at start-up) and time one batch of cold prompts on it; reported per split: the
layers per stage (every split auto chose), the predicted shares (of the first start), each
stage's measured busy seconds per batch and the slowest stage over the mean stage (medians),
input tok/s (median), and whether both splits gave the same first tokens. Time it on a quiet
machine (nothing else running).

--sim prints, for every model of the simulator's catalog at PP 2, 4 and 8 on B300, the count
split and the auto split from the simulator's cost model (what `wavepp simulate` and its grids
run), balanced on cold prompts of 8K and of 128K tokens in waves of 16,384 (the paper's M),
with the slowest stage's predicted share over the mean share.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from wavepp.engine import Engine
from wavepp.random_checkpoint import TinyModelSpec, make_model

KIMI_FULL_ATTENTION = (3, 7, 11, 15, 19, 23, 26)
VOCAB = 512
EXPERT = 64  # the expert width; the dense MLP is 9 x this, as in both released models
SIM_PROMPTS = (8192, 131072)  # --sim: cold prompts of these many tokens
SIM_WAVE_TOKENS = 16384

# what both models share: widths in the released proportions, scaled to hidden 256
SHARED = dict(
    hidden_size=256,
    num_heads=4,
    num_kv_heads=4,
    intermediate_size=9 * EXPERT,
    moe_intermediate_size=EXPERT,
    num_experts=32,
    num_experts_per_tok=8,
    kv_lora_rank=32,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    vocab_size=VOCAB,
    seed=1,
)
MODELS = {
    "deepseek": TinyModelSpec(
        arch="deepseek_v3", num_layers=61, first_k_dense=3, q_lora_rank=64, **SHARED
    ),
    "kimi": TinyModelSpec(
        arch="kimi_linear",
        num_layers=27,
        layer_types=tuple(
            "full_attention" if i in KIMI_FULL_ATTENTION else "linear_attention" for i in range(27)
        ),
        first_k_dense=1,
        linear_num_heads=4,
        linear_head_dim=64,
        **SHARED,
    ),
}


def cold_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(n)]


def run_batch(engine: Engine, prompts) -> tuple[float, list[float], list[int]]:
    """(input tok/s, each stage's busy seconds, first tokens) of one batch."""
    before = [s.busy_s for s in engine.stats().stages]
    t0 = time.perf_counter()
    results = engine.prefill(prompts)
    wall = time.perf_counter() - t0
    after = [s.busy_s for s in engine.stats().stages]
    if not all(r.ok for r in results):
        raise RuntimeError(next(r.error for r in results if not r.ok))
    tokens = sum(len(p) for p in prompts)
    return (
        tokens / wall,
        [b - a for a, b in zip(before, after)],
        [r.first_token_id for r in results],
    )


def bench(path: Path, model: str, pp: int, args) -> list[dict]:
    """`--repeat` rounds; in each, an engine of each split (in turn, the order alternating)
    starts, takes a warm-up batch and one timed batch of cold prompts, and shuts down (a
    process holds one pipeline). Auto measures at every start, so its split may differ
    between starts: every split it chose is kept."""
    runs: dict[str, list] = {"even": [], "auto": []}
    for i in range(args.repeat):
        prompts = cold_prompts(args.num_prompts, args.prompt_len, seed=i)
        for split in ("even", "auto") if i % 2 == 0 else ("auto", "even"):
            with Engine(str(path), pp=pp, dtype="float32", layer_split=split) as engine:
                engine.prefill(cold_prompts(4, args.prompt_len, seed=1000 + i))  # warm-up
                engine.reset()  # nothing cached from the warm-up
                tok_s, busy, first = run_batch(engine, prompts)
                chosen = engine.stage_split
            runs[split].append((tok_s, busy, first, chosen))
            print(
                f"  {model} pp{pp} {split:4s} run {i}: layers "
                f"{','.join(map(str, chosen.sizes))}, {tok_s:8.0f} tok/s, busy "
                + " ".join(f"{b:.2f}" for b in busy),
                file=sys.stderr,
            )
    rows = []
    for split, done in runs.items():
        busy = [statistics.median(r[1][s] for r in done) for s in range(pp)]
        splits = sorted({r[3].sizes for r in done})
        rows.append(
            {
                "model": model,
                "pp": pp,
                "split": split,
                "layers": [list(s) for s in splits],
                "predicted_shares": [round(s, 4) for s in done[0][3].shares],
                "cost_source": done[0][3].costs.source,
                "busy_s": [round(b, 3) for b in busy],
                "slowest_over_mean": round(max(busy) / statistics.mean(busy), 3),
                "input_tok_s": round(statistics.median(r[0] for r in done), 1),
                "same_first_tokens": [r[2] for r in done] == [r[2] for r in runs["even"]],
            }
        )
    return rows


def sim_splits(hardware: str) -> None:
    from wavepp.models import split_layers
    from wavepp.sim.cost.hardware import get_hardware
    from wavepp.sim.cost.model_catalog import MODELS as CATALOG
    from wavepp.sim.cost.stages import layer_costs, packed_waves

    hw = get_hardware(hardware)
    print(f"| model | prompt | PP | even | slowest / mean | auto | slowest / mean |   ({hardware})")
    print("|---|---|---|---|---|---|---|")
    for name, shape in CATALOG.items():
        for prompt in SIM_PROMPTS:
            costs = layer_costs(shape, hw, packed_waves([(prompt, 0)] * 4, SIM_WAVE_TOKENS))
            for pp in (2, 4, 8):
                even = tuple(b - a for a, b in split_layers(shape.num_layers, pp))
                auto = costs.balanced(pp)
                print(
                    f"| {name} | {prompt // 1024}K | {pp} | {','.join(map(str, even))} | "
                    f"{max(costs.shares(even)) * pp:.3f} | {','.join(map(str, auto))} | "
                    f"{max(costs.shares(auto)) * pp:.3f} |"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="deepseek,kimi", help="comma list of: deepseek, kimi")
    ap.add_argument("--pp", default="2,3", help="comma list of pipeline depths")
    ap.add_argument("--repeat", type=int, default=3, help="engine starts per split (interleaved)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--sim", action="store_true", help="the simulator's splits (no engine runs)")
    ap.add_argument("--hardware", default="B300", help="--sim: the simulated GPU")
    args = ap.parse_args()
    if args.sim:
        sim_splits(args.hardware)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.model.split(","):
            if model not in MODELS:
                ap.error(f"unknown --model {model!r}; choose from {', '.join(MODELS)}")
            path = make_model(Path(tmp) / model, MODELS[model])
            for pp in (int(p) for p in args.pp.split(",")):
                rows += bench(path, model, pp, args)
    print(
        "| model | PP | split | layers | predicted shares | busy s per batch | slowest / mean "
        "| input tok/s | same first tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['pp']} | {r['split']} | "
            + " or ".join(",".join(map(str, s)) for s in r["layers"])
            + " | "
            + " ".join(f"{100 * s:.1f}%" for s in r["predicted_shares"])
            + f" | {' '.join(f'{b:.2f}' for b in r['busy_s'])} | {r['slowest_over_mean']:.3f} | "
            f"{r['input_tok_s']:.0f} | {r['same_first_tokens']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
