"""wavepp over sglang-pp on a grid, SGLang v0.5.18's mechanisms added to the earlier sglang-pp
one at a time (sim/loops/sglang.py): admission on schedule, the radix walks of every pass, fixed
chunks (which make the v0.5.18 preset). Geometric means over the grid's settings and over those
at concurrency 8 or more.

    python benchmarks/sglang_attribution.py --grid kimi-k3 --json attribution.json

The simulator is deterministic: one run each.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace

from wavepp.jsonfile import write_json
from wavepp.sim import SGLANG_LEGACY, SGLANG_V0518
from wavepp.sim.studies.grid import get_grid, run_one
from wavepp.sim.loops.sglang import SGLANG_PRESETS

STEPS = {
    "legacy": SGLANG_LEGACY,
    "+ admit_on_schedule": SGLANG_LEGACY.with_changes(admit_on_schedule=True),
    "+ match_scope considered": SGLANG_LEGACY.with_changes(admit_on_schedule=True, match_scope="considered"),
    "+ fixed chunks (v0.5.18)": SGLANG_V0518,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", default="kimi-k3")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    SGLANG_PRESETS.update(STEPS)      # the steps as presets, so GridSetting can name them
    settings = get_grid(args.grid)
    t0, out = time.perf_counter(), []
    print("| SGLang mechanisms | all settings | c >= 8 |\n|---|---|---|")
    for name in STEPS:
        rows = [r for s in settings for r in run_one(replace(s, sglang=name, policies=("wavepp", "sglang-pp")))]
        out += [{**r, "step": name} for r in rows]
        ratios = {}
        for r in rows:
            ratios.setdefault((r["workload"], r["concurrency"]), {})[r["policy"]] = r["input_tok_s"]
        every = [v["wavepp"] / v["sglang-pp"] for v in ratios.values()]
        high = [v["wavepp"] / v["sglang-pp"] for (_, c), v in ratios.items() if c >= 8]
        print(f"| {name} | {_gain(every)} | {_gain(high)} |", flush=True)
    print(f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        write_json(args.json, out, {"grid": args.grid})


def _gain(ratios: list[float]) -> str:
    return f"{100 * (math.exp(sum(map(math.log, ratios)) / len(ratios)) - 1):+.1f}%"


if __name__ == "__main__":
    main()
