"""The KV tiers' Prometheus metrics, from every stage's `StageCounters` at the scrape:

wavepp_kv_tier_hit_blocks_total{stage,tier}      blocks admitted requests reused, by where
                                                 this stage had them: pool | host | store
wavepp_kv_tier_bytes{stage,tier}                 bytes held now: host (its host tier)
wavepp_kv_tier_moved_bytes_total{stage,tier,direction}
                                                 bytes copied: host | store, in (to the
                                                 pool) | out (from it; store: what it took)
wavepp_kv_tier_store_load_seconds_total{stage}   fetching and checking store entries
wavepp_kv_tier_store_refused_loads_total{stage}  loads refused: a block gone or bad (the
                                                 request computed it)
wavepp_kv_tier_store_corrupt_entries_total{stage}  entries that failed their checksum
wavepp_kv_tier_store_dropped_puts_total{stage}   blocks not stored (writer queue full, the
                                                 store full or unreachable)
wavepp_kv_tier_store_reachable{stage}            1 while the store answers
wavepp_kv_tier_store_namespace_info{stage,namespace}  the keys' prefix: replicas whose
                                                 namespaces differ (another layer split,
                                                 dtype, block size or checkpoint) share
                                                 nothing
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


def tier_families(stages):
    """The families above for `stages`, each with `.stage_id` and `.counters`."""
    hits = CounterMetricFamily(
        "wavepp_kv_tier_hit_blocks",
        "blocks admitted requests reused, by the tier this stage had them in",
        labels=["stage", "tier"],
    )
    held = GaugeMetricFamily(
        "wavepp_kv_tier_bytes", "bytes a KV tier holds now", labels=["stage", "tier"]
    )
    moved = CounterMetricFamily(
        "wavepp_kv_tier_moved_bytes",
        "bytes copied between the pool and a lower tier",
        labels=["stage", "tier", "direction"],
    )
    store = {
        name: CounterMetricFamily(f"wavepp_kv_tier_store_{name}", text, labels=["stage"])
        for name, text in (
            ("load_seconds", "time fetching and checking shared-store entries"),
            ("refused_loads", "loads the store refused: a block gone or bad"),
            ("corrupt_entries", "store entries that failed their checksum (never loaded)"),
            ("dropped_puts", "blocks not stored: the writer's queue or the store full, or down"),
        )
    }
    reachable = GaugeMetricFamily(
        "wavepp_kv_tier_store_reachable", "1 while the shared store answers", labels=["stage"]
    )
    namespace = GaugeMetricFamily(
        "wavepp_kv_tier_store_namespace_info",
        "the prefix of this stage's keys in the shared store",
        labels=["stage", "namespace"],
    )
    for s in stages:
        c, stage = s.counters, str(s.stage_id)
        loaded = c.host_loaded_blocks + c.store_loaded_blocks
        for tier, value in (
            ("pool", c.reused_blocks - loaded),
            ("host", c.host_loaded_blocks),
            ("store", c.store_loaded_blocks),
        ):
            hits.add_metric([stage, tier], value)
        held.add_metric([stage, "host"], c.host_held_bytes)
        backend = dict(c.store)
        for tier, direction, blocks in (
            ("host", "in", c.host_loaded_blocks),
            ("host", "out", c.host_offloaded_blocks),
            ("store", "in", c.store_loaded_blocks),
            ("store", "out", backend.get("put_blocks", 0)),
        ):
            moved.add_metric([stage, tier, direction], blocks * c.block_bytes)
        if c.store_namespace:
            store["load_seconds"].add_metric([stage], backend.get("load_seconds", 0.0))
            store["refused_loads"].add_metric([stage], c.store_refused_loads)
            store["corrupt_entries"].add_metric([stage], backend.get("corrupt", 0))
            store["dropped_puts"].add_metric([stage], backend.get("dropped_puts", 0))
            reachable.add_metric([stage], backend.get("reachable", 0))
            namespace.add_metric([stage, c.store_namespace], 1)
    yield from (hits, held, moved, *store.values(), reachable, namespace)
