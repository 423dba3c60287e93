"""The paper's headline taken apart: wavepp / trtllm-pp at c = 128 with 4K suffixes (GLM-5 and
MiniMax-M2, PP4 B300), TensorRT-LLM's mechanisms added to trtllm-pp one at a time
(`wavepp.sim.studies.attribution`), then single switches of the paper's setup changed.

    python benchmarks/paper_attribution.py --markdown attribution.md --json attribution.json
    python benchmarks/paper_attribution.py --ablation --markdown ablation.md   # the paper's ablation settings

The simulator is deterministic: one run each, 512 requests per run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from wavepp.jsonfile import write_json
from wavepp.sim.studies.attribution import (
    ablation_markdown,
    ablation_rows,
    attribution_markdown,
    attribution_rows,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="glm-5,minimax-m2")
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--num-requests", type=int, default=512)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--ablation", action="store_true",
                   help="instead: the ablation grid's systems at the paper's three ablation settings (K2, K3)")
    p.add_argument("--markdown", metavar="PATH")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    t0 = time.perf_counter()
    if args.ablation:
        rows = ablation_rows(jobs=args.jobs)
        text = ablation_markdown(rows)
    else:
        rows = attribution_rows(tuple(args.models.split(",")), concurrency=args.concurrency,
                                num_requests=args.num_requests, jobs=args.jobs)
        text = attribution_markdown(rows)
    print(text)
    print(f"{len(rows)} rows in {time.perf_counter() - t0:.1f} s")
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        write_json(args.json, rows, {"argv": vars(args)})


if __name__ == "__main__":
    main()
