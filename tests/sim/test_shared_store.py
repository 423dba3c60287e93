"""The KV store every replica shares, simulated (sim/core/shared_store.py): an LRU of entries by
bytes behind each stage's StoreTier, keyed by the stage's layer range, so the stage of the same
layers on another replica reuses what one computed; its fetches are charged to the stage's next
wave over the store link, its puts are not."""

import pytest

from wavepp.cache import hash_blocks
from wavepp.cache.store_tier import StoreTier
from wavepp.sched import PlannerConfig
from wavepp.sim import SimCosts, build_sim, run_closed_loop
from wavepp.sim.core.shared_store import SimSharedStore

BS = 4
BLOCK_BYTES = 1000
BW = 1e6  # store link, bytes/s one way: a block is 1 ms
LATENCY = 5e-3  # per fetch
T = 1e-2  # every wave's compute


def test_lru_by_bytes_drops_the_least_recently_used_first():
    store = SimSharedStore(capacity_bytes=3500)
    big, small = store.link(BLOCK_BYTES), store.link(500)  # two stages' entry sizes
    big.put(["a1", "a2", "a3"], [0, 1, 2])
    small.put(["b1"], [0])
    assert store.used_bytes == 3500 and list(store._entries) == ["a1", "a2", "a3", "b1"]
    assert big.fetch(["a1"]) is not None  # touched: a2 is now the least recently used
    assert list(store._entries) == ["a2", "a3", "b1", "a1"]
    assert big.fetch(["a2", "gone"]) is None  # one missing: nothing touched, nothing fetched
    big.put(["a3"], [5])  # held: touched, nothing stored
    assert list(store._entries) == ["a2", "b1", "a1", "a3"] and store.num_stored == 4
    big.put(["a4"], [3])  # 1,000 bytes more: a2 goes
    assert list(store._entries) == ["b1", "a1", "a3", "a4"] and store.num_dropped == 1
    small.put(["b2", "b3"], [1, 2])  # b1 goes for b2, a1 for b3
    assert list(store._entries) == ["a3", "a4", "b2", "b3"] and store.num_dropped == 3
    store.link(1500).put(["c1"], [0])  # 500 bytes free: a3 goes
    assert list(store._entries) == ["a4", "b2", "b3", "c1"] and store.num_dropped == 4
    assert store.used_bytes == 3500
    store.link(4000).put(["huge"], [0])  # larger than the store: not kept, nothing dropped
    assert "huge" not in store and store.num_dropped == 4
    assert store.exists(["a1", "a4", "b3"]) == [False, True, True]
    assert (big.num_fetches, big.num_fetched_bytes, big.num_put_bytes) == (2, 1000, 5000)
    assert big.take_counts() == (2, 5000) and big.take_counts() == (0, 0)
    store.check_integrity()


def test_a_tier_of_another_namespace_finds_nothing():
    store = SimSharedStore(100 * BLOCK_BYTES)
    hashes = hash_blocks(list(range(16)), BS)
    first = StoreTier("m/l0-2", BLOCK_BYTES, store.link(BLOCK_BYTES))
    first.publish(hashes, [0, 1, 2, 3])
    same = StoreTier("m/l0-2", BLOCK_BYTES, store.link(BLOCK_BYTES))  # another replica's
    other = StoreTier("m/l0-3", BLOCK_BYTES, store.link(BLOCK_BYTES))
    assert same.match(hashes, 0) == 4 and same.match(hashes, 1) == 3
    assert other.match(hashes, 0) == 0 and other.fetch(hashes) is None
    assert other.num_refused_loads == 1


def _sim(store: SimSharedStore, namespace: str = "m/l0-1"):
    costs = SimCosts(
        wave_seconds=lambda stage, chunks: T,
        store_link_bytes_s=BW,
        store_fetch_latency_s=LATENCY,
    )
    pcfg = PlannerConfig(block_size=BS, num_stages=1, static_wave_tokens=64)
    tier = StoreTier(namespace, BLOCK_BYTES, store.link(BLOCK_BYTES))
    return build_sim(
        "static",
        1,
        costs,
        stage_num_blocks=16,
        block_size=BS,
        planner_config=pcfg,
        check_integrity=True,
        store_tiers=[tier],
    )


def test_a_prefix_another_pipeline_computed_is_fetched_and_only_the_fetch_is_charged():
    prompt = list(range(17))  # 4 full blocks + 1 token
    store = SimSharedStore(100 * BLOCK_BYTES)
    first, second, other = _sim(store), _sim(store), _sim(store, namespace="m/l1-2")
    computed = run_closed_loop(first, [prompt, list(range(100, 103))], 1)
    # the first wave puts its 4 full blocks beside the compute: neither it nor the next wave
    # there waits for them
    assert computed.cached_tokens == 0 and computed.seconds == pytest.approx(2 * T, rel=1e-12)
    assert len(store) == 4 and first.servers[0].store_tier.num_published_blocks == 4
    fetched = run_closed_loop(second, [prompt], 1)
    # one fetch of 4 blocks, then the last token computed
    assert fetched.cached_tokens == 16 and second.servers[0].store_tier.num_loaded_blocks == 4
    assert fetched.seconds == pytest.approx(T + LATENCY + 4 * BLOCK_BYTES / BW, rel=1e-12)
    assert len(store) == 4  # its one new block is the partial last one: nothing to put
    missed = run_closed_loop(other, [prompt], 1)  # another layer range: computes it all
    assert missed.cached_tokens == 0 and missed.seconds == pytest.approx(T, rel=1e-12)
    assert len(store) == 8
