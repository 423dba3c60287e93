"""What a benchmark leaves behind: a terminal table, JSON rows, a plot, a Chrome trace."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from wavepp.jsonfile import write_json  # noqa: F401 - part of this module's API


def machine() -> str:
    import os

    return (
        f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_implementation()} "
        f"{platform.python_version()}, torch {torch.__version__}"
    )


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo, as lscpu shows it), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def print_table(rows: list[dict], console, title: str) -> None:
    """One row per (workload, concurrency, policy); within a setting the fastest first (in
    bold), and each policy's input tok/s as a ratio to wavepp's (to the first policy's when
    wavepp did not run)."""
    from rich.table import Table

    table = Table(title=title)
    policies = [r["policy"] for r in rows]
    ref_policy = "wavepp" if "wavepp" in policies else (policies[0] if policies else "wavepp")
    for col in (
        "workload",
        "c",
        "policy",
        "input tok/s",
        "computed tok/s",
        f"vs {ref_policy}",
        "hit / ideal",
        "TTFT p50/p95 ms",
        "stage util",
        "idle in/adm",
        "adm p50/p99 ms",
    ):
        table.add_column(col, justify="right" if col not in ("workload", "policy") else "left")
    base = {
        (r["workload"], r["concurrency"]): r["input_tok_s"]
        for r in rows
        if r["policy"] == ref_policy
    }
    best = {}
    for r in rows:
        key = (r["workload"], r["concurrency"])
        best[key] = max(best.get(key, 0.0), r["input_tok_s"])
    for r in sorted(rows, key=lambda r: (r["workload"], r["concurrency"], -r["input_tok_s"])):
        ref = base.get((r["workload"], r["concurrency"]))
        ratio = f"{r['input_tok_s'] / ref:.2f}x" if ref else "-"
        util = "/".join(f"{u:.0%}" for u in r["stage_utilization"]) or "n/a"
        idle = (
            "/".join(
                f"{a:.0%}:{b:.0%}"
                for a, b in zip(r["stage_idle_input_frac"], r["stage_idle_admission_frac"])
            )
            or "n/a"
        )
        adm = (
            "n/a"
            if r["admission_p50_ms"] is None
            else f"{r['admission_p50_ms']:.1f} / {r['admission_p99_ms']:.1f}"
        )
        fastest = r["input_tok_s"] == best[(r["workload"], r["concurrency"])]
        table.add_row(
            r["workload"],
            str(r["concurrency"]),
            r["policy"],
            f"{r['input_tok_s']:,.0f}",
            f"{r['computed_tok_s']:,.0f}",
            ratio,
            f"{r['hit_rate']:.1%} / {r['ideal_hit_rate']:.1%}",
            f"{r['ttft_p50_ms']:,.0f} / {r['ttft_p95_ms']:,.0f}",
            util,
            idle,
            adm,
            style="bold" if fastest and len(rows) > 1 else None,
        )
    console.print(table)


def write_plot(path: str, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, wl in zip(axes[0], workloads):
        for pol in sorted({r["policy"] for r in rows if r["workload"] == wl}):
            pts = sorted(
                (r["concurrency"], r["input_tok_s"])
                for r in rows
                if r["workload"] == wl and r["policy"] == pol
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=pol)
        ax.set_xscale("log", base=2)
        ax.set_title(wl)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("input tokens/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chrome_trace(stats, label: str, pid: int) -> list[dict]:
    """Chrome trace events (Perfetto): one track per stage (wave spans), one for rounds."""
    spans = stats.wave_spans
    t0 = min([s[2] for s in spans] + [r[1] for r in stats.round_spans] + [float("inf")])
    if t0 == float("inf"):
        return []
    events = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}}]
    num_stages = len(stats.stages)
    for s in range(num_stages):
        events.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": s, "args": {"name": f"stage {s}"}}
        )
    events.append(
        {
            "ph": "M",
            "name": "thread_name",
            "pid": pid,
            "tid": num_stages,
            "args": {"name": "admission rounds"},
        }
    )
    for stage, wave, start, end in spans:
        events.append(
            {
                "ph": "X",
                "name": f"wave {wave}",
                "pid": pid,
                "tid": stage,
                "ts": 1e6 * (start - t0),
                "dur": 1e6 * (end - start),
            }
        )
    for rid, start, end in stats.round_spans:
        events.append(
            {
                "ph": "X",
                "name": f"round {rid}",
                "pid": pid,
                "tid": num_stages,
                "ts": 1e6 * (start - t0),
                "dur": 1e6 * (end - start),
            }
        )
    return events


def write_trace(path: str, events: list[dict]) -> None:
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
