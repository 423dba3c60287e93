"""The host KV tier: an LRU of evicted blocks by bytes, filled by the pool's evictions, read
back by a stage whose agreed prefix runs past its GPU pool, and charged on the next wave as
bytes over the host link."""

import pytest

from wavepp.cache import BlockPool, HostTier, hash_blocks
from wavepp.sched import PlannerConfig
from wavepp.sim import SimCosts, build_sim, run_closed_loop

BS = 4
BLOCK_BYTES = 1000
BW = 1e6  # host link, bytes/s one way: a block is 1 ms
T = 1e-2  # every wave's compute


def test_lru_by_bytes_drops_the_least_recently_used_first():
    tier = HostTier(
        capacity_bytes=3 * BLOCK_BYTES + 500, block_bytes=BLOCK_BYTES, snapshot_bytes=500
    )
    for h in (11, 12, 13):
        tier.offload(h)
    assert tier.used_bytes == 3000 and tier.transferred_bytes == 3000
    tier.offload(11)  # held: touched, no bytes move
    assert tier.transferred_bytes == 3000
    tier.offload(14, has_snapshot=True)  # 1,500 bytes: 12, the least recent, goes
    assert list(tier._blocks) == [13, 11, 14] and tier.num_dropped == 1
    assert tier.used_bytes == 3500
    tier.offload(15, has_snapshot=True)  # 13 and 11 go
    assert list(tier._blocks) == [14, 15] and tier.num_dropped == 3
    tier.check_integrity()


def test_a_snapshot_offloaded_alone_is_joined_by_its_block_later():
    tier = HostTier(10 * BLOCK_BYTES, BLOCK_BYTES, snapshot_bytes=300)
    tier.offload_snapshot(21)  # the GPU pool kept block 21, freed its state's slot
    assert 21 not in tier and len(tier) == 0 and tier.used_bytes == 300
    assert tier.snapshot_boundaries([21], 0, 1) == ()
    tier.offload(21)  # the block follows: only its bytes move now
    assert 21 in tier and tier.snapshot_boundaries([21], 0, 1) == (1,)
    assert tier.used_bytes == tier.transferred_bytes == BLOCK_BYTES + 300
    tier.check_integrity()


def test_match_and_snapshot_boundaries_run_from_a_start():
    tier = HostTier(10 * BLOCK_BYTES, BLOCK_BYTES, snapshot_bytes=100)
    chain = [101, 102, 103, 104, 105]
    tier.offload(102)
    tier.offload(103, has_snapshot=True)
    tier.offload(105)
    assert tier.match(chain, 1) == 2 and tier.match(chain, 0) == 0 and tier.match(chain, 4) == 1
    assert tier.snapshot_boundaries(chain, 1, 3) == (3,)  # the state after block 2
    load = tier.onboard(chain[1:3], num_snapshots=1)
    assert (load.num_blocks, load.num_bytes) == (2, 2 * BLOCK_BYTES + 100)


def _cycle(pool, rid, tokens):
    """One request through a pool alone: reserve, commit, materialize, publish, free."""
    hashes = hash_blocks(tokens, BS)
    assert pool.reserve(rid, -(-len(tokens) // BS)).ok
    assert pool.commit(rid, hashes).ok
    pool.materialize(rid)
    pool.publish(rid, len(tokens))
    pool.free(rid)
    return hashes


def test_eviction_offloads_computed_blocks_in_eviction_order():
    tier = HostTier(100 * BLOCK_BYTES, BLOCK_BYTES)
    pool = BlockPool(4, BS, host_tier=tier)
    a = _cycle(pool, "a", list(range(16)))  # 4 cached blocks
    assert len(tier) == 0  # nothing evicted yet
    _cycle(pool, "b", list(range(100, 108)))  # 2 blocks: a's two deepest leaves go
    assert list(tier._blocks) == [a[3], a[2]]
    assert tier.take_transferred_bytes() == 2 * BLOCK_BYTES and tier.transferred_bytes == 0
    pool.check_integrity()


def _sim(tier, num_blocks=16):
    costs = SimCosts(wave_seconds=lambda stage, chunks: T, host_link_bytes_s=BW)
    pcfg = PlannerConfig(block_size=BS, num_stages=1, static_wave_tokens=64)
    return build_sim(
        "static",
        1,
        costs,
        stage_num_blocks=num_blocks,
        block_size=BS,
        planner_config=pcfg,
        check_integrity=True,
        host_tiers=[tier],
    )


def test_a_prefix_in_the_host_tier_is_reused_and_its_bytes_charged_to_the_wave():
    prompt = list(range(17))  # 4 full blocks + 1 token
    tier = HostTier(100 * BLOCK_BYTES, BLOCK_BYTES)
    for h in hash_blocks(prompt, BS):  # evicted earlier, offloaded
        tier.offload(h)
    tier.take_transferred_bytes()
    sim = _sim(tier)
    report = run_closed_loop(sim, [prompt], 1)
    assert report.cached_tokens == 16 and tier.num_loaded == 4
    # the one wave computes 1 token and waits for 4 blocks over the host link first
    assert report.seconds == pytest.approx(T + 4 * BLOCK_BYTES / BW, rel=1e-12)
    assert sim.stats[0].busy_s == pytest.approx(T + 4 * BLOCK_BYTES / BW, rel=1e-12)


def test_a_prefix_past_the_host_tier_is_computed_and_charges_nothing():
    prompt = list(range(17))
    tier = HostTier(100 * BLOCK_BYTES, BLOCK_BYTES)
    tier.offload(hash_blocks(prompt, BS)[1])  # not a prefix: block 0 is missing
    tier.take_transferred_bytes()
    report = run_closed_loop(_sim(tier), [prompt], 1)
    assert report.cached_tokens == 0 and tier.num_loaded == 0
    assert report.seconds == pytest.approx(T, rel=1e-12)


def test_the_wave_that_evicts_pays_for_the_offload():
    # a 5-block pool: a's 4 full blocks stay cached, b needs all 5 blocks (4 of a's evicted)
    tier = HostTier(100 * BLOCK_BYTES, BLOCK_BYTES)
    sim = _sim(tier, num_blocks=5)
    a, b = list(range(16)), list(range(100, 120))
    report = run_closed_loop(sim, [a, b, a], 1)
    spans = sorted((s, e) for _, _, s, e in sim.wave_spans)
    # wave 1 (a): T. Wave 2 (b): its escrow evicts a's 4 blocks, offloaded first. Wave 3 (a
    # again): 3 blocks loaded back (the 4th is recomputed: one token at least is), and the 4
    # blocks of b that make room for them offloaded
    assert [e - s for s, e in spans] == pytest.approx(
        [T, T + 4 * BLOCK_BYTES / BW, T + (3 + 4) * BLOCK_BYTES / BW], rel=1e-12
    )
    assert report.cached_tokens == 12
    assert (tier.num_offloaded, tier.num_loaded) == (8, 3)


def test_a_hybrid_prefix_resumes_from_a_state_in_the_host_tier():
    # snapshots every 2 blocks: the host tier holds a's 4 blocks with the states after blocks 2
    # and 4; the request loads both blocks and both states, and resumes after block 4
    prompt, snapshot_bytes = list(range(17)), 300
    tier = HostTier(100 * BLOCK_BYTES, BLOCK_BYTES, snapshot_bytes)
    for i, h in enumerate(hash_blocks(prompt, BS)):
        tier.offload(h, has_snapshot=(i + 1) % 2 == 0)
    tier.take_transferred_bytes()
    costs = SimCosts(wave_seconds=lambda stage, chunks: T, host_link_bytes_s=BW)
    pcfg = PlannerConfig(block_size=BS, num_stages=1, static_wave_tokens=64)
    sim = build_sim(
        "static",
        1,
        costs,
        stage_num_blocks=16,
        block_size=BS,
        planner_config=pcfg,
        check_integrity=True,
        host_tiers=[tier],
        hybrid=True,
        snapshot_interval_blocks=2,
    )
    report = run_closed_loop(sim, [prompt], 1)
    assert report.cached_tokens == 16 and tier.num_loaded == 4
    assert report.seconds == pytest.approx(
        T + (4 * BLOCK_BYTES + 2 * snapshot_bytes) / BW, rel=1e-12
    )
    pool = sim.servers[0].pool
    assert pool.num_snapshots == 2  # the loaded states are the GPU pool's again


def test_two_hybrid_stages_of_different_pools_reuse_a_prefix_split_between_gpu_and_host():
    # stage 0 holds 7 blocks, stage 1 ten: a's prefix stays on stage 1's GPU, while stage 0
    # keeps part of it and gets the rest back from its host tier; the agreed prefix is the same
    tiers = [
        HostTier(100 * BLOCK_BYTES, BLOCK_BYTES, 300),
        HostTier(100 * BLOCK_BYTES, BLOCK_BYTES, 300),
    ]
    costs = SimCosts(wave_seconds=lambda stage, chunks: T, host_link_bytes_s=BW)
    pcfg = PlannerConfig(block_size=BS, num_stages=2, static_wave_tokens=64)
    sim = build_sim(
        "static",
        2,
        costs,
        stage_num_blocks=[7, 10],
        block_size=BS,
        planner_config=pcfg,
        check_integrity=True,
        host_tiers=tiers,
        hybrid=True,
        snapshot_interval_blocks=2,
    )
    a, b = list(range(17)), list(range(100, 113))
    report = run_closed_loop(sim, [a, b, a, b, a], 1)
    assert report.num_failed == 0
    assert [sim.records[i].num_cached_tokens for i in range(5)] == [0, 0, 16, 12, 16]
    assert tiers[0].num_loaded > 0 and tiers[1].num_loaded == 0


def test_blocks_are_loaded_before_the_escrow_offloads_into_a_full_tier():
    # the tier holds exactly a's 4 blocks; making room for a evicts b's 4, whose offload pushes
    # a's out of the tier: a's copy must be taken first
    a, b = list(range(17)), list(range(100, 116))
    tier = HostTier(4 * BLOCK_BYTES, BLOCK_BYTES)
    for h in hash_blocks(a, BS):
        tier.offload(h)
    tier.take_transferred_bytes()
    sim = _sim(tier, num_blocks=5)
    report = run_closed_loop(sim, [b, a], 1)
    assert report.num_failed == 0 and report.cached_tokens == 16
    assert set(tier._blocks) == set(hash_blocks(b, BS))
    spans = sorted((s, e) for _, _, s, e in sim.wave_spans)
    assert spans[1][1] - spans[1][0] == pytest.approx(T + (4 + 4) * BLOCK_BYTES / BW, rel=1e-12)


def test_a_load_whose_blocks_the_tier_drops_while_room_is_made_is_refused():
    # one stage, 3 snapshot slots: c's state after block 2 holds one; a needs 3 (two boundaries
    # and its working slot), so reserve evicts c's alone and offloads it into a tier that holds
    # exactly a's 4 blocks and 2 states, dropping a's first block: the lease is refused, holds
    # nothing, and nothing is loaded (only c's state went out)
    from wavepp.cache import SnapshotPool
    from wavepp.sched.messages import LeaseItem, LeaseMsg, ProbeItem, ProbeMsg
    from wavepp.sched.stage_server import StageServer

    S = 300
    a, c = list(range(17)), list(range(200, 209))
    tier = HostTier(4 * BLOCK_BYTES + 2 * S, BLOCK_BYTES, S)
    for i, h in enumerate(hash_blocks(a, BS)):
        tier.offload(h, has_snapshot=(i + 1) % 2 == 0)
    tier.take_transferred_bytes()
    pool = SnapshotPool(8, BS, num_slots=3, interval_blocks=2, host_tier=tier)
    assert pool.reserve("c", 3).ok and pool.reserve_snapshots("c", (2,)).ok
    assert pool.commit("c", hash_blocks(c, BS)).ok
    pool.materialize("c")
    pool.publish("c", len(c))
    pool.free("c")
    assert pool.num_snapshots == 1
    stage = StageServer(0, pool)
    hashes = tuple(hash_blocks(a, BS))
    (hint,) = stage.handle(ProbeMsg(1, (ProbeItem(7, hashes, len(a)),))).hints
    assert hint.num_blocks == 4 and hint.snapshot_set() == {2, 4}
    (result,) = stage.handle(LeaseMsg(1, (LeaseItem(7, 4, 1),))).results
    assert not result.ok and "left the host tier" in result.reason
    assert not pool.has_request(7) and tier.num_loaded == 0
    assert stage.tiers.take_host_bytes() == S  # c's state, offloaded
    pool.check_integrity()
    tier.check_integrity()
