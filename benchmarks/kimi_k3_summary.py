"""The Kimi K3 grid's comparison, beside the paper's figures, from `wavepp simulate --grid
kimi-k3 --json K3.json`:

    python benchmarks/kimi_k3_summary.py K3.json [--markdown out.md]

Prints in how many settings at c >= 8 wavepp is the highest of all policies (and, where it is
not, which policy is and by how much), the geometric means of wavepp over SGLang PP8, vLLM PP8,
TP8/EP8 and DP8/EP8 (all 36 settings and the 18 at c >= 8) beside the paper's +9.2% and +15.7% (over
its 28 settings), and the paper's absolute figures beside ours.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

# The paper's Kimi K3 figures (shared/PAPER.md): geometric means over its 28 settings, and
# (workload, c) -> (wavepp input tok/s or None, gain over TensorRT-LLM TP8/EP8)
PAPER_GEOMEAN = {"sglang-pp": 0.092, "vllm-pp": 0.157}
PAPER_POINTS = {("cold-128k", 32): (35878, 0.626), ("cold-64k", 32): (None, 0.588),
                ("cold-256k", 32): (None, 0.378), ("reuse-256k", 32): (218743, 0.533)}


def summarize(rows: list[dict]) -> list[str]:
    by_setting: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        by_setting[(r["workload"], r["concurrency"])][r["policy"]] = r["input_tok_s"]
    high = {k: v for k, v in by_setting.items() if k[1] >= 8}
    wins = [k for k, v in high.items() if v["wavepp"] >= max(v.values())]
    lines = [f"wavepp highest of all policies in {len(wins)} of {len(high)} settings at c >= 8"]
    for (workload, c), v in sorted(high.items()):
        best = max(v, key=v.get)
        if best != "wavepp":
            lines.append(f"  {workload} c={c}: {best} {v[best]:,.0f} against wavepp {v['wavepp']:,.0f} "
                         f"({v[best] / v['wavepp'] - 1:+.1%})")
    for other in ("sglang-pp", "vllm-pp", "tp-ep", "dp-ep"):
        if any(other not in v for v in by_setting.values()):
            continue  # a run without that policy (dp-ep joined the grid later)
        def gain(keys):
            logs = [math.log(by_setting[k]["wavepp"] / by_setting[k][other]) for k in keys]
            return math.exp(sum(logs) / len(logs)) - 1
        paper = PAPER_GEOMEAN.get(other)
        lines.append(f"geometric mean wavepp / {other}: {gain(list(by_setting)):+.1%} over all "
                     f"{len(by_setting)} settings, {gain(list(high)):+.1%} over the {len(high)} at c >= 8 "
                     f"(paper: {'-' if paper is None else f'{paper:+.1%}'} over its 28)")
    for (workload, c), (tok_s, gain_tp) in PAPER_POINTS.items():
        v = by_setting.get((workload, c))
        if v is None:
            continue
        paper_tok = "-" if tok_s is None else f"{tok_s:,}"
        lines.append(f"{workload} c={c}: wavepp {v['wavepp']:,.0f} input tok/s (paper {paper_tok}), over tp-ep "
                     f"{v['wavepp'] / v['tp-ep'] - 1:+.1%} (paper over TensorRT-LLM TP8/EP8: {gain_tp:+.1%})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="rows of `wavepp simulate --grid kimi-k3 --json`")
    ap.add_argument("--markdown", help="also write the lines as a Markdown list")
    args = ap.parse_args()
    data = json.load(open(args.json))
    rows = data["rows"] if isinstance(data, dict) else data
    lines = summarize([r for r in rows if r.get("grid", "kimi-k3") == "kimi-k3"])
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(f"- {line.strip()}" for line in lines) + "\n")


if __name__ == "__main__":
    main()
