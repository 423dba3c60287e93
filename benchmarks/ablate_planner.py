"""The balanced planner's rules, each switched off in turn: what each one is worth.

    python benchmarks/ablate_planner.py --grid paper,kimi --markdown ablation.md --json ablation.json
    python benchmarks/ablate_planner.py --runtime --model smollm2 --pp 2 --repeat 3 --json runtime.json

Simulator (default): every setting of the grids runs once with all rules on, every policy of
the grid (or those rows read from `--baseline`, the JSON of `wavepp simulate --grid ...` at the
same commit), then `wavepp` alone once per variant: each rule of `BalancedRules` off, and
`fill_waves` off (the equal-times caps instead of filled waves). The baselines keep every rule
(lockstep runs the balanced planner too; only wavepp's is changed). Per grid and variant it
reports the settings where wavepp is the highest of all policies and within 2% of it (the
README's tie), the geometric mean of wavepp's throughput over all rules on, the worst setting,
how many settings lose more than 0.5%, and those where requests never finish (a stall: the
simulator ends with nothing left to run). The simulator is deterministic: one run each.

Runtime (`--runtime`): the CPU runtime's closed loop (`wavepp bench`'s workloads and
measurement) on short-suffix and reuse at concurrency 8 and 128, policy wavepp, all rules on and
each rule off, interleaved run by run on one engine (each run from empty caches), `--repeat`
times; prints medians of input tokens/s and their ratio to all rules on, and the hit rates.
Rules that act only while filling waves (the simulator's mode) do nothing on the runtime, which
keeps equal times; they are left out of it unless named with --rules. So is `never_stall`: off,
a wave that fits nothing leaves the runtime waiting forever (seen on a 4-layer checkpoint, reuse
at c = 2), and the run never ends; the simulator ends such a run and counts its requests failed.

A variant is a factory registered under "balanced" in the planner registry
(`wavepp.sched.planners.PLANNERS`), so the simulator and the runtime build it as they build the
planner itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from wavepp.sched.planners import PLANNERS, BalancedPlanner, BalancedRules

ALL_ON = "all rules on"
FILL_WAVES = "fill_waves"           # a PlannerConfig mode, not a rule: off = the equal-times caps
# rules that act only with PlannerConfig.fill_waves (the runtime keeps equal times)
FILL_ONLY = ("double_deep_queue", "cap_double_at_longest", "cold_first")
# off, the runtime can wait forever for a wave that never comes
RUNTIME_SKIPS = FILL_ONLY + ("never_stall",)
TIE = 0.98                          # the README's tie: within 2% of the best
LOSS = 0.995                        # a setting "loses" when wavepp falls under 99.5% of all-on


def variants(names: list[str] | None, *, runtime: bool) -> list[str]:
    """ALL_ON, then each rule (or `names`) off; the simulator adds fill_waves off."""
    if names is None:
        names = [n for n in BalancedRules.names() if not (runtime and n in RUNTIME_SKIPS)]
        if not runtime:
            names.append(FILL_WAVES)
    for n in names:
        if n != FILL_WAVES:
            BalancedRules().without(n)          # an unknown name raises here, naming the choices
    return [ALL_ON] + names


def register(variant: str) -> None:
    """Make every later balanced planner this variant."""
    if variant == ALL_ON:
        PLANNERS["balanced"] = BalancedPlanner
    elif variant == FILL_WAVES:
        PLANNERS["balanced"] = _equal_times
    else:
        PLANNERS["balanced"] = functools.partial(BalancedPlanner, rules=BalancedRules().without(variant))


# ---- simulator ---------------------------------------------------------------------------------

def run_sim(args) -> int:
    from wavepp.sim.studies.grid import get_grid, run_grid

    names = args.rules.split(",") if args.rules else None
    todo = variants(names, runtime=False)
    settings = [s for g in args.grid.split(",") for s in get_grid(g)]
    t0 = time.perf_counter()
    if args.baseline:
        import json
        rows = json.loads(Path(args.baseline).read_text())["rows"]
        keys = {_key(s) for s in settings}
        base = [r for r in rows if _row_key(r) in keys]
        if {_row_key(r) for r in base} != keys:
            raise SystemExit(f"--baseline {args.baseline} lacks some settings of --grid {args.grid}")
    else:
        base = run_grid(settings, jobs=args.jobs)
    print(f"all rules on, every policy: {len(base)} rows ({time.perf_counter() - t0:.0f} s)", flush=True)
    ours = {ALL_ON: {_row_key(r): r for r in base if r["policy"] == "wavepp"}}
    jobs = [(v, s) for v in todo[1:] for s in settings]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for (v, s), row in zip(jobs, pool.map(_run_variant, jobs, chunksize=1)):
            ours.setdefault(v, {})[_key(s)] = row
            if row["num_failed"]:
                print(f"  {v}: {row['num_failed']} of {row['num_requests']} requests unfinished in "
                      f"{_label(_key(s))}", flush=True)
    wall = time.perf_counter() - t0
    others: dict[tuple, float] = {}
    for r in base:
        if r["policy"] != "wavepp":
            k = _row_key(r)
            others[k] = max(others.get(k, 0.0), r["input_tok_s"])
    if args.json:      # the rows first: a summary that fails leaves them
        from wavepp.jsonfile import write_json
        write_json(args.json, [{"variant": v, **row} for v, per in ours.items() for row in per.values()],
                   {"argv": sys.argv[1:], "wall_s": wall, "best_other": [
                       {"grid": k[0], "model": k[1], "workload": k[2], "concurrency": k[3],
                        "input_tok_s": x} for k, x in others.items()]})
    table = summarize(todo, ours, others)
    text = markdown(table, args, wall)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


def summarize(todo: list[str], ours: dict, others: dict) -> list[dict]:
    """One record per (grid, variant): best counts, geomean and worst ratio to all-on. A
    setting with unfinished requests (a stall) counts as losing; the geomean is over the others."""
    out = []
    for grid in sorted({k[0] for k in others}):
        keys = sorted(k for k in others if k[0] == grid)
        on = {k: r["input_tok_s"] for k, r in ours[ALL_ON].items()}
        for v in todo:
            x = {k: r["input_tok_s"] for k, r in ours[v].items()}
            stalled = [k for k in keys if ours[v][k]["num_failed"]]
            ratios = {k: x[k] / on[k] for k in keys}
            done = [k for k in keys if k not in stalled]
            worst = min(keys, key=ratios.get)
            best = max(keys, key=ratios.get)
            out.append({
                "grid": grid, "variant": v, "settings": len(keys), "stalled": len(stalled),
                "highest": sum(x[k] >= others[k] * (1 - 1e-9) for k in done),
                "tied": sum(x[k] >= TIE * max(others[k], x[k]) for k in done),
                "geomean": math.exp(sum(math.log(ratios[k]) for k in done) / max(1, len(done))),
                "worst": ratios[worst], "worst_at": _label(worst),
                "best": ratios[best], "best_at": _label(best),
                "losing": sum(ratios[k] < LOSS or k in stalled for k in keys),
                "changed": sum(ours[v][k] != ours[ALL_ON][k] for k in keys),   # any field of the row
            })
    return out


def markdown(table: list[dict], args, wall_s: float) -> str:
    lines = [f"grids {args.grid}: wavepp with each rule off, against all rules on and against the best "
             f"other policy (all rules on); {wall_s:.0f} s on {platform.machine()}", ""]
    lines.append("| grid | rule off | wavepp highest | within 2% of best | geomean vs all on | "
                 "settings < 99.5% | stalled | changed | worst (setting) | best (setting) |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        lines.append(f"| {r['grid']} | {r['variant']} | {r['highest']}/{r['settings']} | "
                     f"{r['tied']}/{r['settings']} | {r['geomean']:.4f} | {r['losing']} | {r['stalled']} | "
                     f"{r['changed']} | "
                     f"{r['worst']:.4f} ({r['worst_at']}) | {r['best']:.4f} ({r['best_at']}) |")
    return "\n".join(lines) + "\n"


def _run_variant(job) -> dict:
    from wavepp.sim.studies.grid import run_one

    variant, setting = job
    register(variant)
    row, = run_one(dataclasses.replace(setting, policies=("wavepp",)))
    return row


def _equal_times(config, **kwargs) -> BalancedPlanner:
    return BalancedPlanner(dataclasses.replace(config, fill_waves=False), **kwargs)


def _key(s) -> tuple:
    return (s.grid, s.model, s.workload.label, s.concurrency)


def _row_key(r: dict) -> tuple:
    return (r["grid"], r["model"], r["workload"], r["concurrency"])


def _label(k: tuple) -> str:
    return f"{k[1]} {k[2]} c={k[3]}"


# ---- runtime -----------------------------------------------------------------------------------

def run_runtime(args) -> int:
    from wavepp.bench.measure import run_closed_loop
    from wavepp.cli.bench import build_workloads, requests_for
    from wavepp.engine import Engine

    names = args.rules.split(",") if args.rules else None
    todo = variants(names, runtime=True)
    if FILL_WAVES in todo:
        raise SystemExit("fill_waves is the simulator's mode; the runtime ablates rules only")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    engine = Engine(args.model, pp=args.pp, policy="wavepp", dtype=args.dtype, device="cpu")
    rows = []
    try:
        workloads = {c: build_workloads(args, engine.vocab_size, requests_for(args, c)) for c in concurrencies}
        engine.prefill([wl.prompts[0][:256] for wl in workloads[concurrencies[0]]])    # warm up
        print(f"ablate_planner --runtime: {args.model} pp={args.pp} {args.dtype} on {_cpu()}", flush=True)
        for rep in range(args.repeat):
            for c in concurrencies:
                for index in range(len(workloads[c])):
                    wl = workloads[c][index]
                    for v in (todo if rep % 2 == 0 else list(reversed(todo))):
                        register(v)
                        engine.reset("wavepp")       # a leader with the variant's planner
                        m = run_closed_loop(engine, wl, c, policy_label=v, repeat=rep)
                        rows.append(m)
                        print(f"  {wl.name} c={c} {v} run {rep + 1}: {m.input_tok_s:,.0f} input tok/s, "
                              f"hit {m.hit_rate:.1%}, {m.num_failed} failed", flush=True)
    finally:
        register(ALL_ON)
        engine.shutdown()
    med = {}
    for m in rows:
        med.setdefault((m.workload, m.concurrency, m.policy), []).append(m)
    lines = ["| workload | c | rule off | input tok/s (median) | vs all on | hit rate | runs |",
             "|---|---|---|---|---|---|---|"]
    for (w, c, v), ms in med.items():
        tok = statistics.median(m.input_tok_s for m in ms)
        on = statistics.median(m.input_tok_s for m in med[(w, c, ALL_ON)])
        hits = "/".join(sorted({f"{m.hit_rate:.3f}" for m in ms}))
        lines.append(f"| {w} | {c} | {v} | {tok:,.0f} | {tok / on:.3f} | {hits} | {len(ms)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        from wavepp.jsonfile import write_json
        write_json(args.json, [m.to_dict() for m in rows], {"argv": sys.argv[1:], "machine": _cpu()})
    return 0


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", default=None,
                    help=f"comma list of rules to switch off (default: all; {', '.join(BalancedRules.names())}, "
                         f"and {FILL_WAVES} on the simulator)")
    ap.add_argument("--json", default=None, metavar="PATH")
    ap.add_argument("--markdown", default=None, metavar="PATH")
    sim = ap.add_argument_group("simulator")
    sim.add_argument("--grid", default="paper,kimi", help="comma list of grids (paper, kimi, ablation)")
    sim.add_argument("--jobs", type=int, default=2, help="parallel processes")
    sim.add_argument("--baseline", default=None, metavar="JSON",
                     help="rows of `wavepp simulate --grid ...` at this commit: all rules on, every policy")
    rt = ap.add_argument_group("runtime")
    rt.add_argument("--runtime", action="store_true", help="ablate on the CPU runtime instead")
    rt.add_argument("--model", default="smollm2", help="built-in name or HF-format directory")
    rt.add_argument("--pp", type=int, default=2)
    rt.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    rt.add_argument("--workload", default="short-suffix,reuse")
    rt.add_argument("--concurrency", default="8,128")
    rt.add_argument("--repeat", type=int, default=3)
    rt.add_argument("--num-requests", type=int, default=None, help="default: max(64, 4 x concurrency)")
    rt.add_argument("--prompt-len", type=int, default=512, help="reuse: prompt length")
    rt.add_argument("--prefix-len", type=int, default=1536, help="short-suffix: shared prefix")
    rt.add_argument("--suffix-len", type=int, default=64, help="short-suffix: suffix")
    rt.add_argument("--num-groups", type=int, default=8)
    args = ap.parse_args(argv)
    args.tokens_per_block, args.trace_file = 32, None     # what build_workloads reads for traces
    return run_runtime(args) if args.runtime else run_sim(args)


if __name__ == "__main__":
    raise SystemExit(main())
