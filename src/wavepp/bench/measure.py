"""One measurement: a workload through an engine at a concurrency, closed loop (or by arrival
times), with the metrics the report prints.

Every measurement starts from empty caches (engine.reset), so policies measured one after the
other see the same state.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass

from wavepp.sched.stats import quantile
from wavepp.workloads import Workload


class BenchError(RuntimeError):
    """Requests of a run failed: its figures would describe the rest only."""


@dataclass(frozen=True)
class Measurement:
    workload: str
    policy: str
    pp: int
    concurrency: int
    repeat: int
    num_requests: int
    num_failed: int
    input_tokens: int
    cached_tokens: int
    seconds: float
    input_tok_s: float
    computed_tok_s: float
    hit_rate: float
    ideal_hit_rate: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    stage_utilization: list[float]
    stage_idle_input_frac: list[float]
    stage_idle_admission_frac: list[float]
    admission_p50_ms: float | None  # None (and empty per-stage lists): not available (over
    admission_p99_ms: float | None  # HTTP, when the server's /metrics does not give it)
    num_waves: int | None
    # the hit rate by the tier the reused tokens came from: pool | host | store (None: not
    # available, over HTTP); a lower tier's share is its largest over the stages
    tier_hit_rates: dict[str, float] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def run_closed_loop(
    engine,
    workload: Workload,
    concurrency: int,
    *,
    policy_label: str,
    repeat: int = 0,
    on_progress=None,
    open_loop: bool = False,
    submit_options: dict | None = None,
) -> Measurement:
    """Keep `concurrency` requests outstanding until every prompt is done (or, with
    `open_loop`, submit at the workload's arrival times). `submit_options`: keyword arguments
    of every `engine.submit` (e.g. kv_transfer=True). Raises BenchError, naming the first
    failure, if any request failed (a throughput of the others would read as a result)."""
    prompts = workload.prompts
    results = [None] * len(prompts)
    lock = threading.Lock()
    done = threading.Event()
    state = {"next": 0, "finished": 0}

    def submit_next():
        with lock:
            i = state["next"]
            if i >= len(prompts):
                return
            state["next"] += 1
        fut = engine.submit(prompts[i], **(submit_options or {}))
        fut.add_done_callback(lambda f, i=i: finished(i, f))

    def finished(i, fut):
        try:
            results[i] = fut.result()
        except Exception as exc:  # recorded as a failure below
            results[i] = exc
        with lock:
            state["finished"] += 1
            n = state["finished"]
        if on_progress is not None:
            on_progress(1)
        if n == len(prompts):
            done.set()
        elif not open_loop:
            submit_next()

    t0 = time.perf_counter()
    if open_loop and workload.arrival_times_s is not None:
        for at in workload.arrival_times_s:
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                time.sleep(delay)
            submit_next()
    else:
        for _ in range(min(concurrency, len(prompts))):
            submit_next()
    done.wait()
    seconds = time.perf_counter() - t0
    failed = [
        f"{type(r).__name__}: {r}" if isinstance(r, Exception) else r.error
        for r in results
        if isinstance(r, Exception) or not r.ok
    ]
    if failed:
        raise BenchError(
            f"{workload.name} c={concurrency} {policy_label}: {len(failed)} of {len(prompts)} "
            f"requests failed; the first: {failed[0]}"
        )
    return summarize(engine, workload, results, seconds, policy_label, concurrency, repeat)


def summarize(
    engine, workload: Workload, results, seconds: float, policy: str, concurrency: int, repeat: int
) -> Measurement:
    ok = [r for r in results if not isinstance(r, Exception) and r.ok]
    inp = sum(r.num_prompt_tokens for r in ok)
    cached = sum(r.num_cached_tokens for r in ok)
    ttft = sorted(1e3 * r.ttft_s for r in ok) or [0.0]
    stats = engine.stats()
    rounds = sorted(1e3 * x for x in stats.round_latencies_s) or [0.0]
    util = [min(1.0, st.busy_s / seconds) for st in stats.stages]
    wait_in = [min(1.0, st.idle_input_s / seconds) for st in stats.stages]
    wait_adm = [
        min(1.0, (st.idle_admission_s + (st.round_s if i else 0.0)) / seconds)
        for i, st in enumerate(stats.stages)
    ]
    return Measurement(
        workload=workload.name,
        policy=policy,
        pp=len(stats.stages),
        concurrency=concurrency,
        repeat=repeat,
        num_requests=len(results),
        num_failed=len(results) - len(ok),
        input_tokens=inp,
        cached_tokens=cached,
        seconds=seconds,
        input_tok_s=inp / seconds,
        computed_tok_s=(inp - cached) / seconds,
        hit_rate=cached / inp if inp else 0.0,
        ideal_hit_rate=workload.ideal_hit_rate,
        ttft_p50_ms=quantile(ttft, 0.5),
        ttft_p95_ms=quantile(ttft, 0.95),
        stage_utilization=util,
        stage_idle_input_frac=wait_in,
        stage_idle_admission_frac=wait_adm,
        admission_p50_ms=quantile(rounds, 0.5),
        admission_p99_ms=quantile(rounds, 0.99),
        num_waves=stats.num_waves,
        tier_hit_rates=tier_hit_rates(engine, inp, cached / inp if inp else 0.0),
    )


def tier_hit_rates(engine, input_tokens: int, hit_rate: float) -> dict[str, float] | None:
    """The run's hit rate split by tier, from the stages' counters (the engine was reset
    before the run, so they count this run): a token a stage loaded from its host tier or
    the store counts there (the stage that loaded the most decides), the rest of the hits
    were in every stage's pool."""
    counters = getattr(engine, "stage_cache_counters", None)
    if counters is None or not input_tokens:
        return None
    stages = [c.counters for c in counters()]
    block_size = engine.config.block_size
    host = max(c.host_loaded_blocks for c in stages) * block_size / input_tokens
    store = max(c.store_loaded_blocks for c in stages) * block_size / input_tokens
    return {"pool": max(0.0, hit_rate - host - store), "host": host, "store": store}


def median_rows(rows: list[Measurement]) -> list[dict]:
    """One row per (workload, policy, concurrency): medians over repeats. A figure that is
    not available (None, or an empty per-stage list: over HTTP, from a server whose /metrics
    lacks it) stays so."""
    groups: dict[tuple, list[Measurement]] = {}
    for m in rows:
        groups.setdefault((m.workload, m.policy, m.concurrency), []).append(m)
    out = []
    for (_wl, _pol, _c), ms in groups.items():
        row = ms[0].to_dict()
        for key in (
            "seconds",
            "input_tok_s",
            "computed_tok_s",
            "hit_rate",
            "ttft_p50_ms",
            "ttft_p95_ms",
            "admission_p50_ms",
            "admission_p99_ms",
        ):
            values = [getattr(m, key) for m in ms]
            row[key] = None if None in values else statistics.median(values)
        for key in ("stage_utilization", "stage_idle_input_frac", "stage_idle_admission_frac"):
            per_stage = [getattr(m, key) for m in ms]
            row[key] = [] if not all(per_stage) else [statistics.median(v) for v in zip(*per_stage)]
        tiers = [m.tier_hit_rates for m in ms]
        if all(tiers):
            row["tier_hit_rates"] = {t: statistics.median(r[t] for r in tiers) for t in tiers[0]}
        row["repeats"] = len(ms)
        out.append(row)
    return out


def by_tier(m) -> str:
    """ " (pool 40.0% host 30.0% store 5.0%)" when a lower tier had hits; else ""."""
    rates = m.tier_hit_rates
    if not rates or not (rates["host"] or rates["store"]):
        return ""
    return " (" + " ".join(f"{t} {r:.1%}" for t, r in rates.items()) + ")"
