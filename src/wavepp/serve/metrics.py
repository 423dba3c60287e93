"""Prometheus metrics of `wavepp serve` (prometheus-client, one registry per server).

Per request (updated when a request ends):
    wavepp_requests_total{outcome}             ok | aborted | rejected | failed | unavailable | bad_request
    wavepp_prompt_tokens_total                 tokens of the prompts served
    wavepp_cached_tokens_total                 of which reused from the cache on every stage
    wavepp_computed_tokens_total               of which computed
    wavepp_ttft_seconds                        histogram: arrival -> first token
    wavepp_queue_seconds                       histogram: arrival -> admitted on every stage
    vllm:time_to_first_token_seconds{priority}, vllm:request_queue_time_seconds{priority}
                                               the same two by the request's priority, under
                                               vLLM's names
Read from the engine at each scrape:
    wavepp_requests_waiting, wavepp_requests_running, wavepp_up
    wavepp_prefix_hit_rate                     cached / prompt tokens since the server started
    wavepp_stage_busy_seconds_total{stage}, wavepp_stage_busy_fraction{stage} (since start)
    wavepp_stage_idle_input_seconds_total{stage}      idle, nothing to run
    wavepp_stage_idle_admission_seconds_total{stage}  idle or blocked waiting for admission
    wavepp_stage_round_seconds_total{stage}    answering admission rounds on the compute loop
    wavepp_waves_total, wavepp_admission_rounds_total
    wavepp_admission_round_seconds             histogram: one admission round's latency
    wavepp_stage_layers{stage}                 the layers each stage holds (--layer-split)
    wavepp_stage_predicted_share{stage}        its predicted share of the pipeline's work (sum
                                               1; from the costs the split was chosen on:
                                               measured at start, or the cost model's)
    wavepp_stage_blocks{stage,state}           used | free | leased | escrowed | in_use | evictable
                                               (stage 0 now, the others' last report)
    wavepp_stage_cache_blocks_total{stage,kind}  probe_hit | reused | evicted: each stage's own
                                               hits, what every stage held for an admitted
                                               request, its evictions (asked of the stages at
                                               the scrape)
    wavepp_kv_tier_*                           the KV tiers (host, the shared store): hits,
                                               bytes held and moved, store loads refused,
                                               corrupt entries, reachability (tier_metrics.py)
    wavepp_kv_exports_total{outcome}           KV hand-off parts (one per stage and request) the
                                               stages reported: written | failed, since the
                                               engine started, every report counted (also one
                                               that came after its request ended)
    wavepp_kv_store_bytes, wavepp_kv_store_max_bytes, wavepp_kv_transfers_swept_total
                                               with --kv-store: its bytes at the last sweep (at
                                               most a sweep interval old), its cap, the
                                               transfers the TTL or the cap dropped
    wavepp_kv_arena_bytes{stage}, wavepp_kv_arena_transfers{stage},
    wavepp_kv_arena_capacity_bytes{stage}      with --kv-transport mooncake: what each stage's
    wavepp_kv_arena_parts_freed_total{stage,reason}   arena holds and has freed (released |
                                               expired | evicted | refused), read at the last
                                               sweep
    wavepp_kv_events_published_total{unit}     with --kv-events-config: KV cache events sent
                                               (unit: batches | events), since the engine
                                               started
    wavepp_kv_events_dropped_total             batches dropped: the publisher's queue was full
    wavepp_kv_events_queued, wavepp_kv_events_announced_blocks   batches waiting to be sent;
                                               blocks announced (held on every stage) now
The names load-aware routers read from vLLM (llm-d's scorers, the Gateway API Inference
Extension), with vLLM's meaning:
    vllm:num_requests_waiting, vllm:num_requests_running   = wavepp_requests_waiting / _running
    vllm:kv_cache_usage_perc                   the fullest stage's blocks neither free nor
                                               evictable, over its blocks (0..1, as vLLM's)

"Since start" is since the server started or since the last POST /debug/reset, which empties
the caches and restarts the engine's own measurements: the per-stage counters and the wave and
round totals then start again from 0 (a counter reset, as Prometheus' rate() expects one). The
per-request counters and the hit rate count from the server's start.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from wavepp.runtime.protocol import EngineError
from wavepp.serve.request_log import RequestLog
from wavepp.serve.tier_metrics import tier_families

# admission rounds on loopback take well under a millisecond to a few: finer buckets below 5 ms
_ROUND_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
OUTCOMES = ("ok", "aborted", "rejected", "failed", "unavailable", "bad_request")


class ServeMetrics:
    def __init__(self, engine):
        self.engine = engine
        self.registry = CollectorRegistry()
        self.t0 = time.monotonic()
        self.requests = Counter(
            "wavepp_requests", "HTTP prompts by outcome", ["outcome"], registry=self.registry
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.prompt_tokens = Counter(
            "wavepp_prompt_tokens", "prompt tokens served", registry=self.registry
        )
        self.cached_tokens = Counter(
            "wavepp_cached_tokens", "prompt tokens reused from the cache", registry=self.registry
        )
        self.computed_tokens = Counter(
            "wavepp_computed_tokens", "prompt tokens computed", registry=self.registry
        )
        self.ttft = Histogram(
            "wavepp_ttft_seconds",
            "arrival to first token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue = Histogram(
            "wavepp_queue_seconds",
            "arrival to admitted on every stage",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        # vLLM's names, by the request's priority (--scheduling-policy priority)
        self.ttft_by_priority = Histogram(
            "vllm:time_to_first_token_seconds",
            "arrival to first token, by priority",
            ["priority"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_by_priority = Histogram(
            "vllm:request_queue_time_seconds",
            "arrival to admitted on every stage, by priority",
            ["priority"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        # the last requests' times (GET /debug/requests): where the time to a first token went
        self.recent = RequestLog()
        self.rounds = Histogram(
            "wavepp_admission_round_seconds",
            "admission round latency",
            buckets=_ROUND_BUCKETS + _LATENCY_BUCKETS,
            registry=self.registry,
        )
        # the prefix hit rate's terms (the counters above hold the same totals, for Prometheus)
        self.num_prompt_tokens = 0
        self.num_cached_tokens = 0
        self.last_stats = None  # the engine's CoreStats at the last scrape
        self._rounds_seen = 0
        self.registry.register(_EngineCollector(self))

    def observe(self, result) -> None:
        """A PrefillResult that ended: count it by outcome, and its tokens and times if served."""
        if result.ok:
            self.requests.labels("ok").inc()
            self.prompt_tokens.inc(result.num_prompt_tokens)
            self.cached_tokens.inc(result.num_cached_tokens)
            self.num_prompt_tokens += result.num_prompt_tokens
            self.num_cached_tokens += result.num_cached_tokens
            self.computed_tokens.inc(result.num_prompt_tokens - result.num_cached_tokens)
            priority = str(result.priority)
            if result.ttft_s is not None:
                self.ttft.observe(result.ttft_s)
                self.ttft_by_priority.labels(priority).observe(result.ttft_s)
            if result.admission_s is not None:
                self.queue.observe(result.admission_s)
                self.queue_by_priority.labels(priority).observe(result.admission_s)
            self.recent.add(result, time.time())
        elif result.error == "aborted":
            self.requests.labels("aborted").inc()
        else:
            self.requests.labels("failed").inc()

    def restart_engine_figures(self) -> None:
        """The engine's measurements were reset (Engine.reset): count time and rounds from now,
        and keep the requests' times from now."""
        self.t0 = time.monotonic()
        self.recent.clear()
        self._rounds_seen = 0
        self.last_stats = None

    def count(self, outcome: str, n: int = 1) -> None:
        self.requests.labels(outcome).inc(n)

    def render(self) -> bytes:
        self._feed_rounds()
        return generate_latest(self.registry)

    def _feed_rounds(self) -> None:
        """Observe the round latencies recorded since the last scrape (the engine keeps a window)."""
        try:
            stats = self.engine.stats(rounds_since=self._rounds_seen)  # no whole-window copy
        except Exception:  # a dead engine has no new rounds
            return
        for latency in stats.round_latencies_s:
            self.rounds.observe(latency)
        self._rounds_seen = stats.num_rounds
        self.last_stats = stats


class _EngineCollector:
    """Values read from the engine at scrape time."""

    def __init__(self, metrics: ServeMetrics):
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
