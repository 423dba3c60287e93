"""`wavepp bench` in this process: the engines it starts and every run on them (`bench_http.py`
measures a running server instead)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from wavepp.cli.args import kv_tier_options, layer_split, stage_blocks
from wavepp.sched.policy import SINGLE_STAGE

if TYPE_CHECKING:
    from wavepp.cli.bench import BenchPlan


class LocalRuns:
    """The runs in this process: one pipeline engine (and one single-stage engine if that
    policy runs), every (workload, concurrency, snapshot interval, policy) interleaved run by
    run on the same engines (intervals [None]: the default grid). It keeps each engine's
    kernel paths (engine name ("pp", "single") -> each stage's) and, with --trace, the trace."""

    def __init__(self, args, plan: BenchPlan, progress, task) -> None:
        self.args = args
        self.plan = plan
        self.progress = progress
        self.task = task
        self.kernels: dict[str, list] = {}
        self.trace_events: list = []

    def run_all(self) -> list:
        """Every run, repeated, policies in reverse order on odd repeats; the rows in run order.
        The engines are shut down on the way out, whatever happened."""
        engines: dict = {}
        rows: list = []
        try:
            self._start(engines)
            self._warm_up(engines)
            first = self.plan.workloads[self.plan.concurrencies[0]]
            for rep in range(self.args.repeat):
                order = self.plan.policies if rep % 2 == 0 else self.plan.policies[::-1]
                for index in range(len(first)):
                    for c, interval in itertools.product(
                        self.plan.concurrencies, self.plan.intervals
                    ):
                        wl = self.plan.workloads[c][index]
                        for pol in order:
                            engine = engines["single" if pol == SINGLE_STAGE else "pp"]
                            rows.append(self._run_one(engine, wl, c, interval, pol, rep))
        finally:
            for engine in engines.values():
                engine.shutdown()
        return rows

    def _start(self, engines: dict) -> None:
        """The engines the policies need, added to `engines` as each starts (so that a failed
        start still shuts down the ones before it)."""
        from wavepp.engine import Engine, EngineConfig

        args, plan = self.args, self.plan
        pipeline_policies = [p for p in plan.policies if p != SINGLE_STAGE]
        if pipeline_policies:
            engines["pp"] = Engine(
                EngineConfig(
                    plan.model,
                    pp=args.pp,
                    policy=pipeline_policies[0],
                    dtype=args.dtype,
                    snapshot_interval_blocks=plan.intervals[0],
                    device=args.device or "cpu",
                    layer_split=layer_split(args.layer_split),
                    pin_cpus=args.pin_cpus,
                    host_kv_gib=args.host_kv_gib,
                    stage_num_blocks=stage_blocks(args.stage_num_blocks),
                    **kv_tier_options(args),
                )
            )
        if SINGLE_STAGE in plan.policies:
            engines["single"] = Engine(
                EngineConfig(
                    plan.model,
                    pp=1,
                    policy="wavepp",
                    dtype=args.dtype,
                    snapshot_interval_blocks=plan.intervals[0],
                    device=args.device or "cpu",
                )
            )

    def _warm_up(self, engines: dict) -> None:
        """First forwards are slow: one short prefill per engine, then each engine's start-up
        profile and kernel paths, printed after every start-up (rank 0's choice is per process)."""
        console = self.progress.console
        first = self.plan.workloads[self.plan.concurrencies[0]]
        for name, engine in engines.items():
            engine.prefill([wl.prompts[0][:256] for wl in first])
            console.print(f"  {name}: {engine.stage_split.describe()}")
            if engine.profile is not None:
                console.print(f"  start-up profile ({name}): {engine.profile.describe()}")
        for name, engine in engines.items():
            self.kernels[name] = list(engine.stage_kernels)
            cpus = engine.stage_cpus  # (the split is on its own line above)
            console.print(
                f"  kernels ({name}): "
                + "; ".join(
                    f"stage {i} {k}" + (f" cpus {','.join(map(str, cpus[i]))}" if cpus else "")
                    for i, k in enumerate(self.kernels[name])
                )
            )

    def _run_one(self, engine, wl, c: int, interval, pol: str, rep: int):
        """One closed-loop run of `pol` from empty caches: prints its line, keeps its trace
        (with --trace), returns its row."""
        from wavepp.bench.measure import by_tier, run_closed_loop
        from wavepp.bench.report import chrome_trace

        progress, task = self.progress, self.task
        engine.reset("wavepp" if pol == SINGLE_STAGE else pol, snapshot_interval_blocks=interval)
        label = pol if interval is None else f"{pol} snap={interval}"
        progress.update(task, description=f"{wl.name} c={c} {label} (run {rep + 1})")
        m = run_closed_loop(
            engine,
            wl,
            c,
            policy_label=label,
            repeat=rep,
            on_progress=lambda n: progress.advance(task, n),
        )
        grid = ""
        if interval is not None:
            ideal = self.plan.ideal_on_grid[(wl.name, wl.num_requests, interval)]
            grid = f" (ideal on the grid {ideal:.1%})"
        progress.console.print(
            f"  {wl.name} c={c} {label} run {rep + 1}: {m.input_tok_s:,.0f} input tok/s, "
            f"{m.computed_tok_s:,.0f} computed tok/s, hit {m.hit_rate:.1%}{grid}{by_tier(m)}, "
            f"util {'/'.join(f'{u:.0%}' for u in m.stage_utilization)}"
        )
        if self.args.trace:
            self.trace_events += chrome_trace(
                engine.stats(), f"{wl.name} c={c} {label} r{rep}", pid=len(self.trace_events) + 1
            )
        return m
