"""Prefix reuse on the real runtime when the stages' pools differ in size.

    .venv/bin/python benchmarks/bench_stage_pools.py [--blocks 40,64] [--workloads 8]

A tiny random Llama (6 layers, hidden 64, fp32) on PP = len(--blocks) stages with those pool
sizes (16-token blocks), under eviction pressure: the end-to-end test's workloads (three
groups of shared prefixes of 40-200 tokens, suffixes of 1-90, an exact repeat and a 500-token
prompt), seeds 2 .. 1 + --workloads, each under wavepp and static after a reset. Prints the
cached tokens per workload and their sum per policy. Which requests overlap depends on timing,
so runs differ: compare builds interleaved (a checkout of another commit on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.runtime.test_e2e import VOCAB, workload  # noqa: E402
from wavepp.engine import Engine  # noqa: E402
from wavepp.random_checkpoint import make_model  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", default="40,64", help="blocks per stage, comma-separated")
    ap.add_argument("--workloads", type=int, default=8)
    args = ap.parse_args(argv)
    blocks = [int(b) for b in args.blocks.split(",")]
    with tempfile.TemporaryDirectory() as d:
        model = make_model(os.path.join(d, "llama"), arch="llama", num_layers=6, hidden_size=64,
                           num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=VOCAB,
                           seed=11)
        cached: dict[str, list[int]] = {}
        with Engine(str(model), pp=len(blocks), policy="wavepp", dtype="float32", block_size=16,
                    stage_num_blocks=blocks) as engine:
            for seed in range(2, 2 + args.workloads):
                for policy in ("wavepp", "static"):
                    engine.reset(policy)
                    results = engine.prefill(workload(seed=seed))
                    cached.setdefault(policy, []).append(sum(r.num_cached_tokens for r in results))
    for policy, counts in cached.items():
        print(f"{policy:8s} cached tokens {sum(counts):6d}  per workload {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
