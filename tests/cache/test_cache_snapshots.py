"""SnapshotPool with tiny numbers (block size 2): snapshot slots, hints, eviction order, and the
known failures of other systems' snapshot placement."""

import pytest

from wavepp.cache import SnapshotPool, default_interval_blocks, hash_blocks, snapshot_boundaries

B = 2


def serve(
    pool: SnapshotPool, request_id: int, prompt: list[int], chunk_tokens: int | None = None
) -> int:
    """Admit as the leader does on one stage, run it in chunks, free it; returns blocks reused."""
    hashes = hash_blocks(prompt, B)
    k = min(pool.match(hashes).num_computed_blocks, (len(prompt) - 1) // B)
    k = pool.match_snapshots(hashes, k).num_blocks
    assert pool.lease(request_id, hashes, k).ok
    assert pool.reserve(request_id, -(-len(prompt) // B) - k).ok
    assert pool.reserve_snapshots(
        request_id, snapshot_boundaries(k, len(prompt), B, pool.interval_blocks)
    ).ok
    assert pool.commit(request_id, hashes[k:]).ok
    pool.materialize(request_id)
    step = chunk_tokens or len(prompt)
    for end in range(k * B + step, len(prompt) + step, step):
        pool.publish(request_id, min(end, len(prompt)))
        pool.check_integrity()
    pool.free(request_id)
    pool.check_integrity()
    return k


def test_boundaries_grid_and_last_reusable():
    assert snapshot_boundaries(0, 21, 2, 4) == (4, 8, 10)  # grid 4, 8 | last reusable 10
    assert snapshot_boundaries(4, 21, 2, 4) == (8, 10)
    assert snapshot_boundaries(0, 20, 2, 4) == (4, 8, 9)  # 20 tokens: block 10 is full, 9 reusable
    assert snapshot_boundaries(0, 3, 2, 4) == (1,)


def test_a_prompt_shorter_than_the_interval_hits_on_repeat():
    pool = SnapshotPool(16, B, num_slots=4, interval_blocks=8)
    prompt = list(range(7))  # 3 full blocks < 8
    assert serve(pool, 1, prompt) == 0
    assert serve(pool, 2, prompt) == 3  # resumes at its last reusable boundary


def test_shared_prefix_then_long_unique_suffix_hits_on_the_grid():
    pool = SnapshotPool(64, B, num_slots=16, interval_blocks=4)
    prefix = list(range(100, 116))  # 8 blocks
    assert serve(pool, 1, prefix + list(range(40))) == 0  # 28 blocks, unique suffix of 20
    # only the last boundary kept would give 0 here; the grid point at 8 is shared
    assert serve(pool, 2, prefix + list(range(300, 340))) == 8


def test_chunks_smaller_than_the_interval_still_save_every_grid_point():
    pool = SnapshotPool(32, B, num_slots=8, interval_blocks=4)
    prompt = list(range(33))  # 16 full blocks
    serve(pool, 1, prompt, chunk_tokens=3)  # chunks of 1.5 blocks < 4 blocks
    hashes = hash_blocks(prompt, B)
    assert [b for b in (4, 8, 12, 16) if pool.snapshot_slot(hashes[b - 1]) is not None] == [
        4,
        8,
        12,
        16,
    ]
    assert pool.match_snapshots(hashes, 16).num_grid_blocks == 16


def test_hint_is_logarithmic():
    pool = SnapshotPool(600, B, num_slots=260, interval_blocks=2)
    prompt = list(range(1001))  # 500 blocks, 250 grid points
    serve(pool, 1, prompt)
    found = pool.match_snapshots(hash_blocks(prompt, B), 500)
    assert found.num_grid_blocks == 500 and found.num_lookups <= 2 * 9 + 1


def test_lease_pins_the_snapshot_and_refuses_where_there_is_none():
    pool = SnapshotPool(16, B, num_slots=3, interval_blocks=2)
    prompt = list(range(9))  # boundaries 2, 4
    serve(pool, 1, prompt)
    hashes = hash_blocks(prompt, B)
    assert not pool.lease(2, hashes, 3).ok  # block 3 cached, no state after it
    assert pool.lease(3, hashes, 4).ok
    # slots: 2 attached (at 2 and 4), 1 free. A request needing 2 slots may evict only the
    # unpinned snapshot at 2 if nothing hangs below it: the one at 4 (pinned) does
    pool.reserve(4, 1)
    assert not pool.reserve_snapshots(4, (1,)).ok
    pool.release(3)
    assert pool.reserve_snapshots(4, (1,)).ok  # evicts 4 (a leaf), then 2 is not needed
    assert pool.snapshot_slot(hashes[3]) is None and pool.snapshot_slot(hashes[1]) is not None
    pool.check_integrity()


def test_a_snapshot_leaves_with_its_block():
    pool = SnapshotPool(5, B, num_slots=4, interval_blocks=2)
    a = list(range(9))
    serve(pool, 1, a)
    assert pool.num_snapshots == 2
    serve(pool, 2, list(range(50, 59)))  # needs all 5 blocks: evicts a's
    assert pool.num_snapshots == 2 and pool.match_snapshots(hash_blocks(a, B), 4).num_blocks == 0


def test_default_interval_from_memory():
    # a snapshot worth 3 blocks, at most a quarter of block memory: one every 12 blocks
    assert default_interval_blocks(3000, 1000) == 12
    assert default_interval_blocks(3000, 1000, max_overhead=1.0) == 3
    assert default_interval_blocks(0, 1000) == 1
    with pytest.raises(ValueError):
        snapshot_boundaries(0, 10, 2, 0)
