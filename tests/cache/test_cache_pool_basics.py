"""BlockPool with tiny numbers (block size 4, eight blocks): exact block ids, exact eviction order."""

from wavepp.cache import BlockPool, PoolRequestState, hash_blocks

B = 4


def tokens(start: int, num_blocks: int) -> list[int]:
    return list(range(start, start + num_blocks * B))


def run_request(pool: BlockPool, request_id, prompt: list[int], *, free: bool = True) -> list[int]:
    """The leader's whole round on one stage: match, lease all present, reserve, commit,
    materialize, publish everything, free. Returns the block table."""
    hashes = hash_blocks(prompt, B)
    num_leased = pool.match(hashes).num_blocks
    assert pool.lease(request_id, hashes, num_leased).ok
    num_new = -(-len(prompt) // B) - num_leased
    assert pool.reserve(request_id, num_new).ok
    assert pool.commit(request_id, hashes[num_leased:]).ok
    table = pool.materialize(request_id)
    pool.publish(request_id, len(prompt))
    if free:
        pool.free(request_id)
    pool.check_integrity()
    return table


def test_fresh_pool_hands_out_lowest_ids_first():
    pool = BlockPool(8, B)
    assert pool.capacity().num_free == 8
    assert pool.reserve("a", 3).victims == (0, 1, 2)
    assert pool.reserve("b", 2).victims == (3, 4)
    pool.check_integrity()
    assert pool.commit("b", []).ok and pool.commit("a", []).ok
    assert pool.materialize("b") == [3, 4]
    assert pool.materialize("a") == [0, 1, 2]


def test_computed_prefix_stays_cached_and_is_reused():
    pool = BlockPool(8, B)
    assert run_request(pool, "a", tokens(0, 3)) == [0, 1, 2]
    cap = pool.capacity()
    assert (cap.num_free, cap.num_evictable, cap.num_leased, cap.num_in_use) == (5, 3, 0, 0)
    # shares blocks 0-1 with "a", then diverges; plus a partial block
    prompt = tokens(0, 2) + tokens(100, 1) + [7, 7]
    hashes = hash_blocks(prompt, B)
    assert pool.match(hashes).num_blocks == pool.match_linear(hashes) == 2
    assert run_request(pool, "b", prompt) == [0, 1, 3, 4]
    assert pool.match(hash_blocks(prompt, B)).num_blocks == 3  # the partial block is never cached


def test_match_probes_in_log_lookups_and_reports_computed_prefix():
    pool = BlockPool(64, B)
    prompt = tokens(0, 40)
    run_request(pool, "a", prompt)
    hashes = hash_blocks(prompt + tokens(1000, 24), B)
    result = pool.match(hashes)
    assert (result.num_blocks, result.num_computed_blocks) == (40, 40)
    assert result.num_lookups <= 2 * 7  # 1, 2, 4, .. 64 then a binary search over (32, 64)
    assert pool.match(hashes[:40]).num_blocks == 40
    assert pool.match([]).num_blocks == 0
    assert pool.match(hash_blocks(tokens(500, 4), B)).num_lookups == 1


def test_eviction_is_lru_among_leaves_then_their_parents():
    pool = BlockPool(8, B)
    a, b, c = tokens(0, 2), tokens(100, 2), tokens(200, 2)
    assert run_request(pool, "a", a) == [0, 1]
    assert run_request(pool, "b", b) == [2, 3]
    assert run_request(pool, "c", c) == [4, 5]
    run_request(pool, "a-again", a)  # touches blocks 0, 1: "a" is now the most recent chain
    # free 6, 7 first; then b's leaf 3 and its parent 2, then c (5, 4), then a (1, 0)
    assert pool.reserve("r", 8).victims == (6, 7, 3, 2, 5, 4, 1, 0)
    pool.check_integrity()


def test_a_shared_parent_goes_only_after_all_its_branches():
    pool = BlockPool(8, B)
    shared = tokens(0, 1)
    run_request(pool, "x", shared + tokens(100, 1))  # blocks 0 (shared), 1
    run_request(pool, "y", shared + tokens(200, 1))  # reuses 0, gets 2; touches 0 again
    run_request(pool, "z", tokens(300, 1))  # block 3, most recent
    # 1 is the oldest leaf; 0 is older than 2 but still has child 2: 2 goes, then 0, then 3
    assert pool.reserve("r", 8).victims == (4, 5, 6, 7, 1, 2, 0, 3)


def test_ties_in_recency_break_deeper_first_then_lower_block_id():
    from wavepp.cache.block import BlockEntry, leaf_order

    old_deep = BlockEntry(1, None, 3, "o", block_id=6, last_access=5)
    old_shallow = BlockEntry(2, None, 1, "o", block_id=2, last_access=5)
    same_depth_low_id = BlockEntry(3, None, 1, "o", block_id=1, last_access=5)
    ranked = sorted([old_shallow, same_depth_low_id, old_deep], key=leaf_order)
    assert ranked == [old_deep, same_depth_low_id, old_shallow]


def test_leased_blocks_are_never_victims():
    pool = BlockPool(8, B)
    prompt = tokens(0, 3)
    run_request(pool, "a", prompt)
    hashes = hash_blocks(prompt, B)
    assert pool.lease("reader", hashes, 3).ok
    assert pool.capacity().num_leased == 3
    before = pool.capacity()
    result = pool.reserve("big", 6)
    assert not result.ok and result.victims == () and "only 5" in result.reason
    assert pool.capacity() == before and not pool.has_request("big")
    pool.check_integrity()
    assert pool.reserve("fits", 5).victims == (3, 4, 5, 6, 7)


def test_victims_stay_matchable_until_materialize_which_evicts_them():
    pool = BlockPool(4, B)
    old = tokens(0, 2)
    run_request(pool, "old", old)
    assert pool.reserve("r", 3).victims == (2, 3, 1)  # two free, then old's leaf
    assert pool.match(hash_blocks(old, B)).num_blocks == 2
    assert pool.commit("r", hash_blocks(tokens(50, 3), B)).ok
    assert pool.match(hash_blocks(old, B)).num_blocks == 2
    assert pool.materialize("r") == [2, 3, 1]
    assert pool.match(hash_blocks(old, B)).num_blocks == 1  # block 1's hash left the index
    pool.check_integrity()


def test_states_of_a_request_through_its_round():
    pool = BlockPool(8, B)
    hashes = hash_blocks(tokens(0, 2), B)
    assert pool.lease("a", hashes, 0).ok
    assert pool.request_state("a") is PoolRequestState.LEASED
    pool.reserve("a", 2)
    assert pool.request_state("a") is PoolRequestState.RESERVED
    pool.commit("a", hashes)
    assert pool.request_state("a") is PoolRequestState.COMMITTED
    assert pool.capacity().num_pending == 2 and pool.capacity().num_escrowed == 2
    pool.materialize("a")
    assert pool.request_state("a") is PoolRequestState.MATERIALIZED
    assert pool.block_table("a") == [0, 1]
    cap = pool.capacity()
    assert (cap.num_in_use, cap.num_escrowed, cap.num_pending) == (2, 0, 2)
    pool.free("a")
    assert not pool.has_request("a")
    pool.check_integrity()


def test_same_calls_same_results():
    def drive():
        pool = BlockPool(8, B)
        out = [run_request(pool, i, tokens(100 * (i % 3), 2 + i % 2)) for i in range(6)]
        return out, pool.reserve("r", 8).victims

    assert drive() == drive()


def test_stale_leaf_queue_items_are_compacted():
    pool = BlockPool(8, B)
    prompt = tokens(0, 1)
    hashes = hash_blocks(prompt, B)
    run_request(pool, "a", prompt)
    for i in range(3000):  # each lease leaves a stale item, each release adds a fresh one
        pool.lease(i, hashes, 1)
        pool.release(i)
    assert len(pool._leaves) <= 2 * pool.capacity().num_evictable + 1024 + 1
    pool.check_integrity()
    assert pool.reserve("r", 8).victims == (1, 2, 3, 4, 5, 6, 7, 0)
