"""Two runs of the same grid side by side: every setting's rows before and after a change.

    wavepp simulate --grid paper --json before.json        # at the commit before
    wavepp simulate --grid paper --json after.json         # at the commit after
    python benchmarks/grid_diff.py before.json after.json [--markdown diff.md]

Prints how many rows changed and, per policy, the geometric mean of after / before input
tok/s; --markdown writes every changed row (input tok/s and TTFT p50, before and after) and the
summary counts a grid's records carry (wavepp best of all policies within 2%, highest, and the
policies ahead of it by more than 2%).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

KEY = ("grid", "model", "workload", "concurrency", "policy")


def load(path: str) -> dict[tuple, dict]:
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"] if isinstance(data, dict) else data
    return {tuple(r[k] for k in KEY): r for r in rows}


def changed(before: dict, after: dict) -> list[tuple]:
    """The rows both runs hold whose input tok/s or TTFT p50 (or p99, where both have it)
    differ, in `before`'s order."""
    return [
        k
        for k in before
        if k in after
        and (
            before[k]["input_tok_s"] != after[k]["input_tok_s"]
            or before[k]["ttft_p50_s"] != after[k]["ttft_p50_s"]
            or before[k].get("ttft_p99_s", after[k].get("ttft_p99_s"))
            != after[k].get("ttft_p99_s", before[k].get("ttft_p99_s"))
        )
    ]


def standings(rows: dict) -> dict:
    """wavepp's standing per setting: best (within 2%), highest, and the policy that leads
    it by more than 2% where one does."""
    by_setting: dict[tuple, dict[str, float]] = defaultdict(dict)
    for (grid, model, workload, c, policy), r in rows.items():
        by_setting[(grid, model, workload, c)][policy] = r["input_tok_s"]
    best = highest = 0
    ahead: dict[str, list[float]] = defaultdict(list)
    for tputs in by_setting.values():
        top = max(tputs.values())
        best += tputs["wavepp"] >= top / 1.02
        highest += tputs["wavepp"] >= top
        leader = max(tputs, key=tputs.get)
        if top > 1.02 * tputs["wavepp"]:
            ahead[leader].append(top / tputs["wavepp"] - 1)
    return {"settings": len(by_setting), "best": best, "highest": highest, "ahead": dict(ahead)}


def summary_lines(before: dict, after: dict) -> list[str]:
    keys = changed(before, after)
    lines = [f"{len(keys)} of {len(before)} rows changed"]
    added = sorted({k[-1] for k in after if k not in before})
    if added:
        lines.append(f"  rows only after: {', '.join(added)} (not in the before run)")
    ratios: dict[str, list[float]] = defaultdict(list)
    for k in keys:
        ratios[k[-1]].append(after[k]["input_tok_s"] / before[k]["input_tok_s"])
    for policy, rs in sorted(ratios.items()):
        geo = math.exp(sum(math.log(r) for r in rs) / len(rs))
        lines.append(
            f"  {policy:<11} after / before input tok/s: geometric mean {geo:.3f} "
            f"(min {min(rs):.3f}, max {max(rs):.3f}, {len(rs)} rows)"
        )
    for label, rows in (("before", before), ("after", after)):
        s = standings(rows)
        leads = ", ".join(
            f"{p} in {len(v)} (up to +{max(v):.1%})" for p, v in sorted(s["ahead"].items())
        )
        lines.append(
            f"  {label}: wavepp best (within 2%) in {s['best']} of {s['settings']}, highest in "
            f"{s['highest']}; ahead of it by > 2%: {leads or 'none'}"
        )
    return lines


def markdown(before: dict, after: dict) -> str:
    out = [
        "| model | workload | c | policy | input tok/s before | after | after / before "
        "| TTFT p50 s before | after | TTFT p99 s before | after |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def p99(row: dict) -> str:  # runs before the grids kept their p99 have none
        return f"{row['ttft_p99_s']:.2f}" if "ttft_p99_s" in row else "-"

    for k in changed(before, after):
        b, a = before[k], after[k]
        out.append(
            f"| {k[1]} | {k[2]} | {k[3]} | {k[4]} | {b['input_tok_s']:,.0f} | "
            f"{a['input_tok_s']:,.0f} | {a['input_tok_s'] / b['input_tok_s']:.3f} | "
            f"{b['ttft_p50_s']:.2f} | {a['ttft_p50_s']:.2f} | {p99(b)} | {p99(a)} |"
        )
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--markdown", metavar="PATH", help="write every changed row as Markdown")
    args = p.parse_args()
    before, after = load(args.before), load(args.after)
    for line in summary_lines(before, after):
        print(line)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(before, after))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
