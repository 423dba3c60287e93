"""The router's /metrics, read from its replica tables at each scrape (prometheus-client):

wavepp_route_requests_total{side,server}        requests sent to the server
wavepp_route_cached_tokens_total{side,server}   prompt tokens its answers said were cached
wavepp_route_in_flight{side,server}             requests in flight there
wavepp_route_up{side,server}                    1 while its health checks pass
wavepp_route_decisions_total{policy,reason}     prefill replicas chosen, by why
wavepp_route_cache_queries_total                the cache policy's questions (all at once)
wavepp_route_cache_query_seconds_total          time it waited for the replicas' answers
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from wavepp.route.replica_table import ReplicaTable

# (name, help, kind, the ReplicaState field it reads)
_PER_REPLICA = (
    ("wavepp_route_requests", "requests sent to the server", "counter", "num_requests"),
    (
        "wavepp_route_cached_tokens",
        "prompt tokens its answers said were cached",
        "counter",
        "cached_tokens",
    ),
    ("wavepp_route_in_flight", "requests in flight there", "gauge", "in_flight"),
    ("wavepp_route_up", "1 while its health checks pass", "gauge", "healthy"),
)


def render_metrics(prefills: ReplicaTable, decodes: ReplicaTable | None) -> bytes:
    """The exposition text of the tables as they are now; reads them, mutates nothing."""
    families = [*_replica_families(prefills, decodes), *_routing_families(prefills)]
    registry = CollectorRegistry()
    registry.register(_Families(families))
    return generate_latest(registry)


class _Families:
    """A collector that yields families made beforehand."""

    def __init__(self, families: list):
        self._families = families

    def collect(self):
        yield from self._families


def _replica_families(prefills: ReplicaTable, decodes: ReplicaTable | None) -> list:
    families = []
    for side, table in (("prefill", prefills), ("decode", decodes)):
        if table is None:
            continue
        for name, doc, kind, field in _PER_REPLICA:
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, doc, labels=["side", "server"]
            )
            for replica in table.replicas:
                family.add_metric([side, replica.url], float(getattr(replica, field)))
            families.append(family)
    return families


def _routing_families(prefills: ReplicaTable) -> list:
    decisions = CounterMetricFamily(
        "wavepp_route_decisions", "prefill replicas chosen, by why", labels=["policy", "reason"]
    )
    for reason, n in sorted(prefills.decisions.items()):
        decisions.add_metric([prefills.policy, reason], n)
    queries = CounterMetricFamily(
        "wavepp_route_cache_queries", "the cache policy's questions to the replicas (all at once)"
    )
    queries.add_metric([], prefills.num_queries)
    seconds = CounterMetricFamily(
        "wavepp_route_cache_query_seconds", "time the cache policy waited for the replicas' answers"
    )
    seconds.add_metric([], prefills.query_seconds)
    return [decisions, queries, seconds]
