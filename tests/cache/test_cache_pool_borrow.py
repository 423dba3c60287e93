"""A stage that holds more of a chain than the prefix agreed over all stages keeps it whole.

The leader leases the prefix cached on every stage; a larger stage may hold blocks past it.
The request computes those blocks again (some stage lacks them), into private blocks, and its
commit pins the cached ones here so that the blocks after them are registered beneath them
(before, every block after the first taken hash stayed private, and this stage lost the rest
of the chain while the smaller stages kept it)."""

from wavepp.cache import BlockPool, hash_blocks

B = 4


def tokens(start: int, num_blocks: int) -> list[int]:
    return list(range(start, start + num_blocks * B))


def cache_chain(pool: BlockPool, request_id, prompt: list[int]) -> None:
    hashes = hash_blocks(prompt, B)
    k = pool.match(hashes).num_blocks
    assert pool.lease(request_id, hashes, k).ok
    assert pool.reserve(request_id, len(hashes) - k).ok
    assert pool.commit(request_id, hashes[k:]).ok
    pool.materialize(request_id)
    pool.publish(request_id, len(prompt))
    pool.free(request_id)


def test_new_blocks_link_under_cached_blocks_past_the_lease():
    pool = BlockPool(16, B)
    cache_chain(pool, "x", tokens(0, 4))  # blocks 0..3
    prompt = tokens(0, 4) + tokens(500, 2)
    hashes = hash_blocks(prompt, B)
    assert pool.match(hashes).num_blocks == 4
    assert pool.lease("r", hashes, 1).ok  # the prefix every stage holds
    assert pool.reserve("r", 5).ok
    result = pool.commit("r", hashes[1:])
    assert result.ok and result.num_registered == 2  # the two blocks past x
    assert pool.capacity().num_leased == 4  # block 0 leased, 1..3 held
    pool.check_integrity()
    table = pool.materialize("r")
    assert table[0] == 0 and not set(table[1:]) & {1, 2, 3}  # recomputed privately
    assert pool.match(hashes).num_blocks == 6  # pending, findable already
    pool.publish("r", len(prompt))
    pool.free("r")
    pool.check_integrity()
    found = pool.match(hashes)
    assert (found.num_blocks, found.num_computed_blocks) == (6, 6)
    cap = pool.capacity()
    assert (cap.num_leased, cap.num_in_use, cap.num_evictable) == (0, 0, 6)


def test_borrowed_blocks_stay_pinned_until_the_request_ends():
    pool = BlockPool(10, B)
    cache_chain(pool, "x", tokens(0, 4))  # blocks 0..3, the rest free
    hashes = hash_blocks(tokens(0, 4) + tokens(500, 2), B)
    assert pool.lease("r", hashes, 1).ok
    assert pool.reserve("r", 5).victims == (4, 5, 6, 7, 8)
    assert pool.commit("r", hashes[1:]).ok
    other = pool.reserve("other", 2)  # block 9, and nothing evictable
    assert not other.ok and "only 1" in other.reason
    pool.materialize("r")
    pool.publish("r", 6 * B)
    pool.free("r")
    assert pool.reserve("other", 2).ok  # now x's and r's blocks may go
    pool.check_integrity()


def test_cancel_and_release_let_go_of_borrowed_blocks():
    pool = BlockPool(16, B)
    cache_chain(pool, "x", tokens(0, 4))
    hashes = hash_blocks(tokens(0, 4) + tokens(500, 2), B)
    assert pool.lease("r", hashes, 1).ok
    assert pool.reserve("r", 5).ok and pool.commit("r", hashes[1:]).ok
    pool.cancel("r")  # the lease stays
    cap = pool.capacity()
    assert (cap.num_leased, cap.num_evictable, cap.num_pending) == (1, 3, 0)
    assert pool.match(hashes).num_blocks == 4
    pool.check_integrity()
    assert pool.reserve("r", 5).ok and pool.commit("r", hashes[1:]).num_registered == 2
    pool.release("r")  # never computed: the new ones go
    cap = pool.capacity()
    assert (cap.num_leased, cap.num_evictable, cap.num_pending, cap.num_free) == (0, 4, 0, 12)
    assert pool.match(hashes).num_blocks == 4
    pool.check_integrity()


def test_no_borrowing_of_an_escrow_victim():
    pool = BlockPool(12, B)
    cache_chain(pool, "x", tokens(0, 4))  # blocks 0..3
    cache_chain(pool, "y", tokens(100, 4))  # blocks 4..7: x is older
    hashes = hash_blocks(tokens(0, 4) + tokens(500, 1), B)
    assert pool.lease("r", hashes, 1).ok
    assert pool.reserve("r", 4).victims == (8, 9, 10, 11)  # the free blocks
    assert pool.reserve("other", 1).victims == (3,)  # x's leaf
    result = pool.commit("r", hashes[1:])
    assert result.ok and result.num_registered == 0  # 1, 2 held; 3 is taken: private
    assert pool.capacity().num_leased == 3
    pool.check_integrity()
    assert pool.commit("other", hash_blocks(tokens(900, 1), B)).ok
    pool.materialize("other")  # evicts 3; 2 stays, held by r
    assert pool.match(hashes).num_blocks == 3
    pool.release("r")
    pool.release("other")
    pool.check_integrity()
