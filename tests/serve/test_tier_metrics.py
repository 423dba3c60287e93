"""The KV tiers' Prometheus families (serve/tier_metrics.py), from stages' counters: hits split
by tier, bytes moved per direction in the stage's block size, the store's own counters only
where a stage has a store."""

from prometheus_client import CollectorRegistry, generate_latest

from wavepp.runtime.cache_queries import StageCacheCounters
from wavepp.sched.stage_server import StageCounters
from wavepp.serve.tier_metrics import tier_families


class _Collector:
    def __init__(self, stages):
        self.stages = stages

    def collect(self):
        yield from tier_families(self.stages)


def _scrape(stages) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(_Collector(stages))
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_hits_by_tier_and_bytes_moved():
    with_store = StageCounters(
        reused_blocks=10,
        host_loaded_blocks=3,
        store_loaded_blocks=4,
        host_held_bytes=5000,
        host_offloaded_blocks=6,
        store_refused_loads=2,
        block_bytes=1000,
        store_namespace="wavepp/abc/l0-2",
        store=(("put_blocks", 7), ("corrupt", 1), ("reachable", 1.0), ("load_seconds", 0.5)),
    )
    m = _scrape(
        [StageCacheCounters(0, with_store, None), StageCacheCounters(1, StageCounters(), None)]
    )
    assert m['wavepp_kv_tier_hit_blocks_total{stage="0",tier="pool"}'] == 3
    assert m['wavepp_kv_tier_hit_blocks_total{stage="0",tier="host"}'] == 3
    assert m['wavepp_kv_tier_hit_blocks_total{stage="0",tier="store"}'] == 4
    assert m['wavepp_kv_tier_moved_bytes_total{direction="out",stage="0",tier="host"}'] == 6000
    assert m['wavepp_kv_tier_moved_bytes_total{direction="out",stage="0",tier="store"}'] == 7000
    assert m['wavepp_kv_tier_moved_bytes_total{direction="in",stage="0",tier="store"}'] == 4000
    assert m['wavepp_kv_tier_bytes{stage="0",tier="host"}'] == 5000
    assert m['wavepp_kv_tier_store_refused_loads_total{stage="0"}'] == 2
    assert m['wavepp_kv_tier_store_corrupt_entries_total{stage="0"}'] == 1
    assert m['wavepp_kv_tier_store_reachable{stage="0"}'] == 1
    assert m['wavepp_kv_tier_store_namespace_info{namespace="wavepp/abc/l0-2",stage="0"}'] == 1
    assert not any('stage="1"' in k for k in m if "_store_" in k)  # stage 1 has no store
