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
Read from the engine at each scrape (serve/engine_metrics.py):
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

from wavepp.serve.engine_metrics import EngineCollector
from wavepp.serve.request_log import RequestLog

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
        self.registry.register(EngineCollector(self))

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
