"""The bench's closed loop over HTTP, against a running `wavepp serve` (`wavepp bench --url`).

The same workloads and the same Measurement as the in-process bench, measured at the client:

    input tokens, cached tokens   usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens
    TTFT                          request sent -> response read (max_tokens=1: the first token),
                                  so HTTP, JSON and the server's event loop are inside it
    seconds                       first request sent -> last response read
    stage utilisation, idle       the server's /metrics counters, after minus before the run
    admission p50/p99             the /metrics histogram's buckets, after minus before the run,
                                  interpolated within a bucket (as Prometheus' histogram_quantile)

Prompts go as token ids, so the server tokenizes nothing. The policy, pipeline depth and block
size are the server's (read from /v1/models): HTTP cannot switch them. A server started with
`--debug` offers POST /debug/reset, which empties every stage's cache between runs as
Engine.reset does in-process; without it the runs start from whatever the server has cached,
and the report says so. A figure the server's /metrics does not give is None ("n/a").
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import httpx

from wavepp.bench.measure import Measurement
from wavepp.sched.stats import quantile
from wavepp.workloads import Workload


class HTTPBenchError(RuntimeError):
    """The server cannot be reached, is not a wavepp server, or failed requests of a run."""


@dataclass(frozen=True)
class ServerInfo:
    url: str
    model: str  # the model's id in the API
    pp: int
    policy: str
    dtype: str
    block_size: int
    vocab_size: int
    can_reset: bool  # started with --debug: POST /debug/reset exists


def wait_until_healthy(
    url: str, process=None, timeout_s: float = 300.0, poll_s: float = 0.2
) -> None:
    """Poll `url`/health until it answers 200. RuntimeError if `process` (a Popen running the
    server) exits first, or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"wavepp serve exited with code {process.returncode} before it was healthy"
            )
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"wavepp serve did not answer {url}/health within {timeout_s:.0f} s")
        time.sleep(poll_s)


def server_info(url: str, timeout_s: float = 10.0) -> ServerInfo:
    """What the server at `url` runs (GET /v1/models); raises HTTPBenchError naming the URL."""
    try:
        r = httpx.get(f"{url}/v1/models", timeout=timeout_s)
    except (httpx.HTTPError, ValueError) as exc:
        raise HTTPBenchError(
            f"cannot reach a server at {url}: {type(exc).__name__}: {exc}"
        ) from None
    if r.status_code != 200:
        raise HTTPBenchError(f"GET {url}/v1/models answered {r.status_code}: {r.text[:200]}")
    try:
        card = r.json()["data"][0]
        info = card["wavepp"]
        return ServerInfo(
            url=url,
            model=card["id"],
            pp=int(info["pp"]),
            policy=info["policy"],
            dtype=info["dtype"],
            block_size=int(info["block_size"]),
            vocab_size=int(info["vocab_size"]),
            can_reset=bool(info.get("debug")),
        )
    except (ValueError, KeyError, IndexError, TypeError):
        raise HTTPBenchError(
            f"{url}/v1/models does not describe a wavepp server (no 'wavepp' entry "
            f"with pp, policy, block_size and vocab_size): {r.text[:200]}"
        ) from None


def reset_caches(info: ServerInfo, timeout_s: float = 300.0) -> bool:
    """Empty every stage's cache (POST /debug/reset, which waits for the pipeline to be idle).
    Returns False when the server offers no reset (not started with --debug)."""
    if not info.can_reset:
        return False
    try:
        r = httpx.post(f"{info.url}/debug/reset", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise HTTPBenchError(
            f"POST {info.url}/debug/reset failed: {type(exc).__name__}: {exc}"
        ) from None
    if r.status_code != 200:
        raise HTTPBenchError(
            f"POST {info.url}/debug/reset answered {r.status_code}: {r.text[:200]}"
        )
    return True


def scrape(url: str, timeout_s: float = 30.0) -> dict[tuple, float]:
    """GET /metrics as {(sample name, sorted label pairs): value}; {} if there is none."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        r = httpx.get(f"{url}/metrics", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise HTTPBenchError(f"GET {url}/metrics failed: {type(exc).__name__}: {exc}") from None
    if r.status_code != 200:
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def run_http_closed_loop(
    info: ServerInfo,
    workload: Workload,
    concurrency: int,
    *,
    repeat: int = 0,
    timeout_s: float = 300.0,
    on_progress=None,
) -> Measurement:
    """Keep `concurrency` requests outstanding over HTTP until every prompt is answered.
    Raises HTTPBenchError when a request fails (the server went away, a 503, a 429, ...): the
    clients stop taking new prompts after the first failure, so a dead server ends the run
    at once instead of after every prompt."""
    from wavepp.serve.loadgen import run_load

    before = scrape(info.url)
    report = run_load(
        info.url,
        workload.prompts,
        concurrency=concurrency,
        timeout_s=timeout_s,
        model=info.model,
        stop_on_error=True,
        on_done=on_progress,
    )
    num_failed = len(workload.prompts) - report.num_ok
    if num_failed:
        first = (
            report.errors[0]
            if report.errors
            else f"{report.num_rejected} answered 429 (too many waiting)"
        )
        raise HTTPBenchError(
            f"{workload.name} c={concurrency} over HTTP: {num_failed} of "
            f"{len(workload.prompts)} requests not answered; first failure: {first}"
        )
    after = scrape(info.url)
    return _measurement(info, workload, concurrency, repeat, report, _delta(before, after))


# ---- from client figures and /metrics deltas to a Measurement --------------------------------


def _delta(before: dict, after: dict) -> dict:
    """after - before per sample; a counter that went down was reset in between (keep after)."""
    out = {}
    for key, value in after.items():
        old = before.get(key, 0.0)
        out[key] = value - old if value >= old else value
    return out


def _measurement(
    info: ServerInfo, workload: Workload, concurrency: int, repeat: int, report, delta: dict
) -> Measurement:
    seconds = report.wall_s
    inp, cached = report.prompt_tokens, report.cached_tokens
    ttft = sorted(1e3 * x for x in report.latencies_s) or [0.0]
    stage = _per_stage(delta, info.pp)
    util = wait_in = wait_adm = []
    if stage is not None:
        util = [min(1.0, s["busy"] / seconds) for s in stage]
        wait_in = [min(1.0, s["idle_input"] / seconds) for s in stage]
        wait_adm = [
            min(1.0, (s["idle_admission"] + (s["round"] if i else 0.0)) / seconds)
            for i, s in enumerate(stage)
        ]
    waves = delta.get(("wavepp_waves_total", ()))
    return Measurement(
        workload=workload.name,
        policy=info.policy,
        pp=info.pp,
        concurrency=concurrency,
        repeat=repeat,
        num_requests=len(workload.prompts),
        num_failed=len(workload.prompts) - report.num_ok,
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
        admission_p50_ms=_histogram_quantile(delta, "wavepp_admission_round_seconds", 0.5),
        admission_p99_ms=_histogram_quantile(delta, "wavepp_admission_round_seconds", 0.99),
        num_waves=None if waves is None else int(waves),
        tier_hit_rates=_tier_hit_rates(delta, info, inp, cached),
    )


def _tier_hit_rates(delta: dict, info: ServerInfo, inp: int, cached: int) -> dict | None:
    """The run's hit rate by tier from `wavepp_kv_tier_hit_blocks_total`'s deltas, as
    in-process (bench/measure.py `tier_hit_rates`); None when the server does not give it."""
    if not inp:
        return None
    loaded = {}
    for tier in ("host", "store"):
        per_stage = [
            delta.get(("wavepp_kv_tier_hit_blocks_total", (("stage", str(s)), ("tier", tier))))
            for s in range(info.pp)
        ]
        if any(v is None for v in per_stage):
            return None
        loaded[tier] = max(per_stage) * info.block_size / inp
    pool = max(0.0, cached / inp - loaded["host"] - loaded["store"])
    return {"pool": pool, **loaded}


def _per_stage(delta: dict, pp: int) -> list[dict] | None:
    """Each stage's busy / idle / round seconds from the /metrics counters, or None if the
    server does not give them all."""
    names = {
        "busy": "wavepp_stage_busy_seconds_total",
        "idle_input": "wavepp_stage_idle_input_seconds_total",
        "idle_admission": "wavepp_stage_idle_admission_seconds_total",
        "round": "wavepp_stage_round_seconds_total",
    }
    out = []
    for stage in range(pp):
        values = {k: delta.get((name, (("stage", str(stage)),))) for k, name in names.items()}
        if any(v is None for v in values.values()):
            return None
        out.append(values)
    return out


def _histogram_quantile(delta: dict, name: str, q: float) -> float | None:
    """The q-quantile in ms of a histogram's observations in `delta`, linearly interpolated
    within its bucket; None when the histogram is missing or saw nothing."""
    buckets = sorted(
        (float(dict(labels)["le"]), value)
        for (sample, labels), value in delta.items()
        if sample == f"{name}_bucket"
    )
    if not buckets or buckets[-1][1] <= 0:
        return None
    # buckets: (upper bound, cumulative count), the last one +Inf
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return 1e3 * lower
            inside = count - below
            frac = (rank - below) / inside if inside else 1.0
            return 1e3 * (lower + frac * (upper - lower))
        lower, below = upper, count
    return 1e3 * lower
