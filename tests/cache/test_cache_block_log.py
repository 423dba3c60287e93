"""A pool's BlockLog (tiny numbers: block size 4, eight blocks): which computed blocks it
records as stored and removed, in order, and the whole set after an overflow."""

from tests.cache.test_cache_pool_basics import B, run_request, tokens
from wavepp.cache import BlockLog, BlockPool, hash_blocks
from wavepp.cache.block_log import REMOVED, STORED


def logged_pool(num_blocks: int = 8, max_changes: int = 64) -> BlockPool:
    pool = BlockPool(num_blocks, B)
    pool.block_log = BlockLog(max_changes, pool.computed_blocks)
    return pool


def test_published_blocks_are_stored_parents_first_and_evictions_removed_children_first():
    pool = logged_pool()
    a = hash_blocks(tokens(0, 3), B)
    run_request(pool, "a", tokens(0, 3) + [9])  # three full blocks and a partial one
    assert pool.block_log.drain().changes == (
        (STORED, a[0], None),
        (STORED, a[1], a[0]),
        (STORED, a[2], a[1]),
    )
    # seven new blocks: five are free (the partial block's went back), two are "a"'s, taken
    # leaf first when "b" materializes, before it publishes its own
    b = hash_blocks(tokens(100, 7), B)
    run_request(pool, "b", tokens(100, 7))
    changes = pool.block_log.drain().changes
    assert changes[:2] == ((REMOVED, a[2], None), (REMOVED, a[1], None))
    assert changes[2:] == tuple((STORED, h, None if i == 0 else b[i - 1]) for i, h in enumerate(b))
    assert pool.block_log.drain().changes == ()


def test_released_before_computed_records_nothing():
    pool = logged_pool()
    hashes = hash_blocks(tokens(0, 2), B)
    assert pool.lease("a", hashes, 0).ok and pool.reserve("a", 2).ok
    assert pool.commit("a", hashes).ok
    pool.release("a")  # pending entries leave the index uncomputed
    assert pool.block_log.drain().changes == ()


def test_an_overflowed_log_sends_the_whole_set_once():
    pool = logged_pool(max_changes=2)
    run_request(pool, "a", tokens(0, 3))
    drained = pool.block_log.drain()
    hashes = hash_blocks(tokens(0, 3), B)
    assert drained.resync and drained.changes == ()
    assert drained.held == (
        (STORED, hashes[0], None),
        (STORED, hashes[1], hashes[0]),
        (STORED, hashes[2], hashes[1]),
    )
    assert pool.block_log.num_resyncs == 1
    assert pool.block_log.drain() == type(drained)()  # then nothing, as a plain drain
