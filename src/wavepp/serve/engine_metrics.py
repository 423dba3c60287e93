"""The figures `wavepp serve`'s /metrics reads from the engine at each scrape (their names and
meanings: serve/metrics.py): load, stage times and splits, blocks, caches, the KV hand-off's
store and arenas, KV events. `EngineCollector` is registered on the server's registry by
`ServeMetrics`; the per-request metrics are ServeMetrics' own."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from wavepp.runtime.protocol import EngineError
from wavepp.serve.tier_metrics import tier_families

if TYPE_CHECKING:
    from wavepp.serve.metrics import ServeMetrics


class EngineCollector:
    """Values read from the engine at scrape time."""

    def __init__(self, metrics: ServeMetrics) -> None:
        self.metrics = metrics

    def collect(self):
        m = self.metrics
        engine = m.engine
        load = engine.load()
        yield from _load(load)
        capacities = engine.stage_capacity()
        yield from _vllm_load(load, capacities)
        prompt = m.num_prompt_tokens
        yield _gauge(
            "wavepp_prefix_hit_rate",
            "cached / prompt tokens since start",
            m.num_cached_tokens / prompt if prompt else 0.0,
        )
        if m.last_stats is not None:
            yield from _stage_times(m.last_stats, max(1e-9, time.monotonic() - m.t0))
        yield from _stage_split(getattr(engine, "stage_split", None))
        yield _stage_blocks(capacities)
        yield from _stage_cache(engine)
        yield _kv_exports(*engine.kv_export_counts())
        events = engine.kv_events_counts()
        if events is not None:
            yield from _kv_events(events)
        store = engine.kv_transfer_usage()
        if store is not None:
            yield from _kv_transfer_usage(store)


def _load(load):
    yield _gauge(
        "wavepp_requests_waiting", "requests queued or in an admission round", load.num_waiting
    )
    yield _gauge(
        "wavepp_requests_running",
        "requests admitted on every stage, computing",
        load.num_running,
    )
    yield _gauge("wavepp_up", "1 while every stage is alive", 0 if load.error else 1)


def _vllm_load(load, capacities):
    """vLLM's names of the load, for routers that score replicas by them."""
    yield _gauge("vllm:num_requests_waiting", "requests waiting to be admitted", load.num_waiting)
    yield _gauge("vllm:num_requests_running", "requests computing", load.num_running)
    usage = [
        (cap.num_blocks - cap.num_free - cap.num_evictable) / cap.num_blocks
        for cap in capacities
        if cap is not None and cap.num_blocks
    ]
    yield _gauge(
        "vllm:kv_cache_usage_perc",
        "KV cache usage of the fullest stage (1 = every block held by a request)",
        max(usage, default=0.0),
    )


def _kv_events(counts: dict[str, int]):
    """The KV cache events' publisher (kv_events/publisher.py)."""
    published = CounterMetricFamily(
        "wavepp_kv_events_published", "KV cache events sent", labels=["unit"]
    )
    published.add_metric(["batches"], counts["published_batches"])
    published.add_metric(["events"], counts["published_events"])
    yield published
    yield CounterMetricFamily(
        "wavepp_kv_events_dropped",
        "KV cache event batches dropped: the publisher's queue was full",
        value=counts["dropped_batches"],
    )
    yield _gauge(
        "wavepp_kv_events_queued", "event batches waiting to be sent", counts["queued_batches"]
    )
    yield _gauge(
        "wavepp_kv_events_announced_blocks",
        "blocks announced as held on every stage",
        counts["announced_blocks"],
    )


def _stage_times(stats, elapsed_s: float):
    """Each stage's busy, idle and round seconds (its last stats), and the wave and round
    totals."""
    busy = CounterMetricFamily(
        "wavepp_stage_busy_seconds", "seconds a stage computed waves", labels=["stage"]
    )
    frac = GaugeMetricFamily(
        "wavepp_stage_busy_fraction", "busy seconds / seconds since start", labels=["stage"]
    )
    idle_input = CounterMetricFamily(
        "wavepp_stage_idle_input_seconds",
        "seconds a stage was idle with nothing to run",
        labels=["stage"],
    )
    idle_admission = CounterMetricFamily(
        "wavepp_stage_idle_admission_seconds",
        "seconds a stage was idle or blocked waiting for admission",
        labels=["stage"],
    )
    round_s = CounterMetricFamily(
        "wavepp_stage_round_seconds",
        "seconds a stage's compute loop spent answering admission rounds",
        labels=["stage"],
    )
    for i, st in enumerate(stats.stages):
        busy.add_metric([str(i)], st.busy_s)
        frac.add_metric([str(i)], min(1.0, st.busy_s / elapsed_s))
        idle_input.add_metric([str(i)], st.idle_input_s)
        idle_admission.add_metric([str(i)], st.idle_admission_s)
        round_s.add_metric([str(i)], st.round_s)
    yield from (busy, frac, idle_input, idle_admission, round_s)
    yield CounterMetricFamily("wavepp_waves", "waves run", value=stats.num_waves)
    yield CounterMetricFamily(
        "wavepp_admission_rounds", "admission rounds run", value=stats.num_rounds
    )


def _stage_split(split):
    """The layer split the engine runs (runtime/stage_split.py): layers and predicted share of
    each stage."""
    if split is None:
        return
    layers = GaugeMetricFamily("wavepp_stage_layers", "layers a stage holds", labels=["stage"])
    shares = GaugeMetricFamily(
        "wavepp_stage_predicted_share",
        "a stage's predicted share of the pipeline's work (the costs its split was chosen on)",
        labels=["stage"],
    )
    for stage, (num_layers, share) in enumerate(zip(split.sizes, split.shares)):
        layers.add_metric([str(stage)], num_layers)
        shares.add_metric([str(stage)], share)
    yield layers
    yield shares


def _stage_blocks(capacities) -> GaugeMetricFamily:
    """Each stage's cache blocks by state, from its last capacity report (None: none yet)."""
    blocks = GaugeMetricFamily(
        "wavepp_stage_blocks",
        "a stage's cache blocks by state (its last report)",
        labels=["stage", "state"],
    )
    for stage, cap in enumerate(capacities):
        if cap is None:
            continue
        used = cap.num_blocks - cap.num_free
        for state, value in (
            ("used", used),
            ("free", cap.num_free),
            ("leased", cap.num_leased),
            ("escrowed", cap.num_escrowed),
            ("in_use", cap.num_in_use),
            ("evictable", cap.num_evictable),
        ):
            blocks.add_metric([str(stage), state], value)
    return blocks


def _stage_cache(engine):
    """Every stage's cache counters, asked of the stages now (a cache query: no prompt)."""
    try:
        counters = engine.stage_cache_counters()
    except EngineError:  # a stage is gone: /metrics still answers, without these
        return
    family = CounterMetricFamily(
        "wavepp_stage_cache_blocks",
        "a stage's cache blocks since start, by what happened: probe_hit (held here when "
        "probed), reused (reused by an admitted request: held on every stage), evicted",
        labels=["stage", "kind"],
    )
    for c in counters:
        for kind, value in (
            ("probe_hit", c.counters.probe_hit_blocks),
            ("reused", c.counters.reused_blocks),
            ("evicted", c.counters.evicted_blocks),
        ):
            family.add_metric([str(c.stage_id), kind], value)
    yield family
    yield from tier_families(counters)


def _kv_exports(written: int, failed: int) -> CounterMetricFamily:
    exports = CounterMetricFamily(
        "wavepp_kv_exports",
        "KV hand-off parts the stages reported, by outcome",
        labels=["outcome"],
    )
    exports.add_metric(["written"], written)
    exports.add_metric(["failed"], failed)
    return exports


def _kv_transfer_usage(store):
    """What the transport holds (the hand-off's last sweep): per stage arena where the transport
    has arenas, the store's bytes where it has a directory store, and what the sweeps dropped."""
    if store.arenas is not None:  # a transport of arenas: per stage
        yield from _kv_arenas(store.arenas)
    if store.store_bytes is not None:  # a transport of a directory store
        yield _gauge(
            "wavepp_kv_store_bytes",
            "bytes in the KV store at its last sweep",
            store.store_bytes,
        )
        yield _gauge("wavepp_kv_store_max_bytes", "the KV store's size cap", store.store_max_bytes)
    swept = CounterMetricFamily(
        "wavepp_kv_transfers_swept", "KV transfers the TTL or the size cap dropped"
    )
    swept.add_metric([], store.num_swept)
    yield swept


def _kv_arenas(arenas: dict):
    for name, key, doc in (
        ("wavepp_kv_arena_bytes", "num_bytes", "bytes a stage's KV arena holds"),
        ("wavepp_kv_arena_transfers", "num_entries", "KV parts a stage's arena holds"),
        ("wavepp_kv_arena_capacity_bytes", "capacity_bytes", "a stage's KV arena's size"),
    ):
        g = GaugeMetricFamily(name, f"{doc} (read at the hand-off's last sweep)", labels=["stage"])
        for stage, arena in arenas.items():
            g.add_metric([str(stage)], getattr(arena, key))
        yield g
    freed = CounterMetricFamily(
        "wavepp_kv_arena_parts_freed",
        "KV parts a stage's arena let go, by why: released (pulled, or given up), "
        "expired (TTL), evicted (room for newer ones), refused (larger than the arena)",
        labels=["stage", "reason"],
    )
    for stage, arena in arenas.items():
        for reason, n in arena.freed.items():
            freed.add_metric([str(stage), reason], n)
    yield freed


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g
