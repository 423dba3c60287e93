"""What `wavepp simulate` writes: a table, JSON rows, a throughput plot, a Chrome trace, and
the grid summaries the README reports."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Sequence

from wavepp.jsonfile import write_json  # noqa: F401 - part of this module's API
from wavepp.sim.core.pipeline import PipelineSim


def print_table(rows: Sequence[dict], title: str = "wavepp simulate") -> None:
    """One line per (setting, policy); `vs first` compares with the setting's first policy."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in (
        "model",
        "hw",
        "pp",
        "workload",
        "conc",
        "policy",
        "input tok/s",
        "vs first",
        "hit",
        "TTFT p50 s",
        "p99 s",
        "util",
        "waves",
        "failed",
    ):
        table.add_column(
            col, justify="right" if col not in ("model", "hw", "workload", "policy") else "left"
        )
    first: dict[tuple, float] = {}
    for r in rows:
        key = (r["grid"], r["model"], r["hardware"], r["pp"], r["workload"], r["concurrency"])
        base = first.setdefault(key, r["input_tok_s"])
        table.add_row(
            r["model"],
            r["hardware"],
            str(r["pp"]),
            r["workload"],
            str(r["concurrency"]),
            r["policy"],
            f"{r['input_tok_s']:,.0f}",
            f"{r['input_tok_s'] / base:.2f}x" if base else "-",
            f"{r['hit_rate']:.2f}",
            f"{r['ttft_p50_s']:.2f}",
            f"{r.get('ttft_p99_s', float('nan')):.2f}",
            f"{r['stage_utilization']:.2f}",
            str(r["num_waves"]),
            str(r["num_failed"]),
        )
    console = Console()
    if not console.is_terminal:  # a file or a pipe: do not squeeze the table to 80 columns
        console = Console(width=160)
    console.print(table)


def write_plot(rows: Sequence[dict], path: str | Path) -> None:
    """Input tokens/s against concurrency, one panel per (model, workload), a line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple, dict[str, list]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    for r in rows:
        panels[(r["model"], r["pp"], r["workload"])][r["policy"]].append(
            (r["concurrency"], r["input_tok_s"])
        )
    n = len(panels)
    cols = min(4, n)
    nrows = -(-n // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False)
    for ax, ((model, pp, workload), lines) in zip(axes.flat, panels.items()):
        for policy, points in lines.items():
            points.sort()
            ax.plot([c for c, _ in points], [v / 1e3 for _, v in points], marker="o", label=policy)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{model} PP{pp} {workload}", fontsize=9)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("input k tok/s")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chrome_trace(runs: Sequence[tuple[str, PipelineSim]]) -> dict:
    """Chrome / Perfetto trace events: a process per run, a thread per stage (waves) and one
    for admission rounds. Times in microseconds of virtual time."""
    events = []
    for pid, (label, sim) in enumerate(runs):
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}})
        for sid in range(sim.num_stages):
            events.append(
                {
                    "ph": "M",
                    "pid": pid,
                    "tid": sid,
                    "name": "thread_name",
                    "args": {"name": f"stage {sid}"},
                }
            )
        events.append(
            {
                "ph": "M",
                "pid": pid,
                "tid": sim.num_stages,
                "name": "thread_name",
                "args": {"name": "admission rounds"},
            }
        )
        for sid, wave_id, start, end in sim.wave_spans:
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": sid,
                    "name": f"wave {wave_id}",
                    "ts": start * 1e6,
                    "dur": (end - start) * 1e6,
                }
            )
        for round_id, start, end in sim.round_spans:
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": sim.num_stages,
                    "name": f"round {round_id}",
                    "ts": start * 1e6,
                    "dur": (end - start) * 1e6,
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(runs: Sequence[tuple[str, PipelineSim]], path: str | Path) -> None:
    Path(path).write_text(json.dumps(chrome_trace(runs)))


def grid_summary(rows: Sequence[dict]) -> list[str]:
    """The checks the README reports: wavepp vs lockstep per setting (paper grid) and whether
    wavepp is the best policy at concurrency >= 8 (kimi grid)."""
    settings: dict[tuple, dict[str, float]] = collections.defaultdict(dict)
    for r in rows:
        settings[(r["grid"], r["model"], r["workload"], r["concurrency"])][r["policy"]] = r[
            "input_tok_s"
        ]
    lines = []
    for grid in sorted({k[0] for k in settings}):
        tag = grid or "simulate"
        mine = {k: v for k, v in settings.items() if k[0] == grid and "wavepp" in v}
        pairs = {k: v for k, v in mine.items() if "lockstep" in v}
        if pairs:
            wins = sum(_at_least(v["wavepp"], v["lockstep"]) for v in pairs.values())
            lines.append(f"[{tag}] wavepp >= lockstep in {wins} of {len(pairs)} settings")
            top = max(k[3] for k in pairs)
            for k, v in sorted(pairs.items()):
                if k[3] == top and k[2].startswith("short_suffix"):
                    lines.append(
                        f"[{tag}] {k[1]} {k[2]} c={top}: wavepp/lockstep = "
                        f"{v['wavepp'] / v['lockstep']:.2f}x"
                    )
        trt = {k: v for k, v in mine.items() if "trtllm-pp" in v}
        if trt:
            wins = sum(_at_least(v["wavepp"], v["trtllm-pp"]) for v in trt.values())
            near = sum(v["wavepp"] >= TIE * v["trtllm-pp"] for v in trt.values())
            lines.append(
                f"[{tag}] wavepp >= trtllm-pp in {wins} of {len(trt)} settings ({near} within 2%)"
            )
            lines.extend(f"[{tag}] {line}" for line in paper_comparison(trt))
        multi = {k: v for k, v in mine.items() if len(v) > 2 and k[3] >= 8}
        if multi:
            near = sum(v["wavepp"] >= TIE * max(v.values()) for v in multi.values())
            lines.append(
                f"[{tag}] wavepp best of all policies (ties within 2%) in {near} of "
                f"{len(multi)} settings at concurrency >= 8"
            )
            best = [k for k, v in multi.items() if _at_least(v["wavepp"], max(v.values()))]
            lines.append(
                f"[{tag}] wavepp highest of all policies in {len(best)} of {len(multi)} "
                f"settings at concurrency >= 8"
            )
            for k, v in sorted(multi.items()):
                if k not in best:
                    winner = max(v, key=v.get)
                    lines.append(
                        f"[{tag}]   {k[1]} {k[2]} c={k[3]}: {winner} "
                        f"{v[winner] / v['wavepp']:.3f}x of wavepp"
                    )
    return lines


TIE = 0.98  # within 2% of the best counts as best (ties)

# The paper's table: input tokens/s at concurrency 128, 4K-token suffixes, PP4 on B300,
# WavePP and TensorRT-LLM's PyTorch executor in pipeline mode (arXiv 2609.35263).
PAPER_FIGURES = {"glm-5": (1213e3, 416e3), "minimax-m2": (1113e3, 551e3)}


def paper_comparison(settings: dict[tuple, dict[str, float]]) -> list[str]:
    """Our wavepp and trtllm-pp beside the paper's figures, for the short-suffix settings at
    concurrency 128 of the models the paper reports (keys: (grid, model, workload, c))."""
    lines = []
    for (_, model, workload, c), v in sorted(settings.items()):
        if model not in PAPER_FIGURES or c != 128 or not workload.startswith("short_suffix"):
            continue
        ours, theirs = (v["wavepp"], v["trtllm-pp"]), PAPER_FIGURES[model]
        lines.append(
            f"paper table {model} {workload} c={c}: wavepp {ours[0] / 1e3:,.0f}K "
            f"(paper {theirs[0] / 1e3:,.0f}K, {ours[0] / theirs[0]:.2f}x of it), "
            f"trtllm-pp {ours[1] / 1e3:,.0f}K (paper {theirs[1] / 1e3:,.0f}K, "
            f"{ours[1] / theirs[1]:.2f}x), wavepp/trtllm-pp {ours[0] / ours[1]:.2f}x "
            f"(paper {theirs[0] / theirs[1]:.2f}x)"
        )
    return lines


def markdown_tables(rows: Sequence[dict]) -> str:
    """The README's tables: per (grid, model) one row per (workload, concurrency), input
    tokens/s of every policy with the best in bold, and the default policy's rank (1: best or
    within 2% of it)."""
    groups: dict[tuple, dict[tuple, dict[str, float]]] = collections.defaultdict(
        lambda: collections.defaultdict(dict)
    )
    policies: dict[tuple, list[str]] = collections.defaultdict(list)
    for r in rows:
        key = (r["grid"], r["model"], r["hardware"], r["pp"])
        groups[key][(r["workload"], r["concurrency"])][r["policy"]] = r["input_tok_s"]
        if r["policy"] not in policies[key]:
            policies[key].append(r["policy"])
    out = []
    for key, settings in groups.items():
        grid, model, hw, pp = key
        cols = policies[key]
        out.append(f"{grid or 'simulate'}: {model}, PP{pp} {hw}, input tokens/s (best in bold)\n")
        ranked = "wavepp" in cols
        out.append(
            "| workload | c | " + " | ".join(cols) + (" | wavepp rank |" if ranked else " |")
        )
        out.append("|---|---|" + "---|" * (len(cols) + ranked))
        for (workload, c), values in settings.items():
            best = max(values.values())
            cells = [
                f"**{_k_tok(values[p])}**" if values.get(p) == best else _k_tok(values.get(p))
                for p in cols
            ]
            rank = [str(rank_of("wavepp", values))] if ranked else []
            out.append(f"| {workload} | {c} | " + " | ".join(cells + rank) + " |")
        out.append("")
    return "\n".join(out)


def _k_tok(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e3:,.0f}k" if value >= 100e3 else f"{value / 1e3:.1f}k"


def rank_of(policy: str, values: dict[str, float]) -> int:
    """1 + the number of policies more than 2% faster than `policy`."""
    mine = values[policy]
    return 1 + sum(1 for p, v in values.items() if p != policy and mine < TIE * v)


def _at_least(a: float, b: float) -> bool:
    """a >= b up to float rounding (identical schedules sum their times in different orders)."""
    return a >= b * (1 - 1e-9)
