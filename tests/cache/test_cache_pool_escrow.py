"""Escrow, claims, in-flight sharing, dedup, publish and release, with exact block ids."""

import pytest

from wavepp.cache import BlockPool, PendingBlockError, PoolRequestState, hash_blocks

B = 4


def tokens(start: int, num_blocks: int) -> list[int]:
    return list(range(start, start + num_blocks * B))


def cache_chain(pool: BlockPool, request_id, prompt: list[int]) -> list[int]:
    hashes = hash_blocks(prompt, B)
    k = pool.match(hashes).num_blocks
    assert pool.lease(request_id, hashes, k).ok
    assert pool.reserve(request_id, len(hashes) - k).ok
    assert pool.commit(request_id, hashes[k:]).ok
    table = pool.materialize(request_id)
    pool.publish(request_id, len(prompt))
    pool.free(request_id)
    return table


def full_pool_with_x_oldest() -> tuple[BlockPool, list[int], list[int]]:
    """8 evictable blocks: chain x = blocks 0, 1 (least recent), chain f = blocks 2..7."""
    pool = BlockPool(8, B)
    x, f = hash_blocks(tokens(0, 2), B), hash_blocks(tokens(100, 6), B)
    assert cache_chain(pool, "x", tokens(0, 2)) == [0, 1]
    assert cache_chain(pool, "f", tokens(100, 6)) == [2, 3, 4, 5, 6, 7]
    return pool, x, f


def test_commit_replaces_a_victim_leased_since_reserve():
    pool, x, f = full_pool_with_x_oldest()
    assert pool.reserve("r", 2).victims == (1, 0)
    lease = pool.lease("reader", x, 2)
    assert lease.ok and lease.num_claimed == 2
    assert pool.capacity().num_escrowed == 0
    pool.check_integrity()
    result = pool.commit("r", hash_blocks(tokens(500, 2), B))
    assert result.ok and result.num_replaced == 2 and result.num_registered == 2
    assert pool.materialize("r") == [7, 6]  # f's leaf, then its parent
    assert pool.match(x).num_blocks == 2 and pool.match(f).num_blocks == 4
    pool.check_integrity()


def test_commit_that_cannot_replace_fails_and_holds_nothing():
    pool, x, f = full_pool_with_x_oldest()
    assert pool.lease("hog", f, 6).ok  # f pinned: only x is claimable
    assert pool.reserve("r", 2).victims == (1, 0)
    assert pool.lease("reader", x, 1).ok  # claims block 0, and 1 has no other replacement
    result = pool.commit("r", [])
    assert not result.ok and result.num_replaced == 0 and "claimed" in result.reason
    assert pool.request_state("r") is PoolRequestState.LEASED
    cap = pool.capacity()
    assert (cap.num_escrowed, cap.num_evictable, cap.num_leased) == (0, 1, 7)
    pool.check_integrity()


def test_lease_of_a_committed_victim_moves_the_escrow_or_is_refused():
    pool, x, f = full_pool_with_x_oldest()
    assert pool.lease("hog", f, 5).ok  # blocks 2..6 pinned; 7 (f's leaf) stays evictable
    assert pool.reserve("r", 2).victims == (1, 0)
    assert pool.commit("r", []).ok
    refused = pool.lease("reader", x, 2)  # would claim two committed victims, only one spare
    assert not refused.ok and "'r'" in refused.reason and not pool.has_request("reader")
    pool.check_integrity()
    lease = pool.lease("reader", x, 1)  # claims block 0; block 7 replaces it in r's escrow
    assert lease.ok and lease.num_claimed == 1
    pool.check_integrity()
    assert pool.materialize("r") == [1, 7]
    assert pool.match(x).num_blocks == 1


def test_another_escrow_may_take_the_parent_of_a_victim():
    pool = BlockPool(2, B)
    chain = hash_blocks(tokens(0, 2), B)
    cache_chain(pool, "c", tokens(0, 2))
    assert pool.reserve("r1", 1).victims == (1,)
    assert pool.reserve("r2", 1).victims == (0,)  # its only child is a victim: a leaf now
    assert pool.commit("r1", []).ok and pool.commit("r2", []).ok
    assert pool.materialize("r2") == [0]  # evicts 0 and, with it, r1's victim below
    assert pool.match(chain).num_blocks == 0
    pool.check_integrity()
    assert pool.materialize("r1") == [1]
    pool.check_integrity()


def test_cancel_frees_a_victim_whose_parent_another_escrow_holds():
    pool = BlockPool(2, B)
    chain = hash_blocks(tokens(0, 2), B)
    cache_chain(pool, "c", tokens(0, 2))
    pool.reserve("r1", 1)
    pool.reserve("r2", 1)
    pool.cancel("r1")  # block 1 cannot stay cached under a parent about to be evicted
    cap = pool.capacity()
    assert (cap.num_free, cap.num_escrowed, cap.num_evictable) == (1, 1, 0)
    assert pool.match(chain).num_blocks == 1
    pool.check_integrity()
    pool.cancel("r2")
    assert pool.capacity().num_evictable == 1
    pool.check_integrity()


def test_cancel_gives_back_the_escrow_and_pending_entries_but_keeps_the_lease():
    pool, x, f = full_pool_with_x_oldest()
    assert pool.lease("r", f, 4).ok
    assert pool.reserve("r", 2).victims == (1, 0)
    assert pool.commit("r", hash_blocks(tokens(900, 2), B)).ok
    assert pool.capacity().num_pending == 2
    pool.cancel("r")
    assert pool.request_state("r") is PoolRequestState.LEASED
    cap = pool.capacity()
    assert (cap.num_escrowed, cap.num_pending, cap.num_leased, cap.num_evictable) == (0, 0, 4, 4)
    assert pool.match(x).num_blocks == 2
    pool.check_integrity()
    assert pool.reserve("r", 1).ok  # may try again


def test_pending_blocks_are_shared_in_flight():
    pool = BlockPool(8, B)
    prompt = tokens(0, 3)
    hashes = hash_blocks(prompt, B)
    pool.reserve("owner", 3)
    pool.commit("owner", hashes)
    probe = pool.match(hashes)
    assert (probe.num_blocks, probe.num_computed_blocks) == (3, 0)
    assert pool.lease("reader", hashes, 3).ok
    pool.reserve("reader", 1)
    pool.commit("reader", hash_blocks(prompt + tokens(50, 1), B)[3:])
    with pytest.raises(PendingBlockError, match="'reader'.*'owner'.*not materialized"):
        pool.materialize("reader")
    assert pool.materialize("owner") == [0, 1, 2]
    assert pool.materialize("reader") == [0, 1, 2, 3]
    with pytest.raises(PendingBlockError, match="not computed"):
        pool.publish("reader", 16)
    pool.publish("owner", 8)
    assert pool.match(hashes).num_computed_blocks == 2
    pool.publish("owner", 12)
    pool.publish("reader", 16)
    assert pool.match(hash_blocks(prompt + tokens(50, 1), B)).num_computed_blocks == 4
    pool.check_integrity()


def test_commit_does_not_register_a_hash_twice():
    pool = BlockPool(8, B)
    hashes = hash_blocks(tokens(0, 2), B)
    pool.reserve("first", 2)
    assert pool.commit("first", hashes).num_registered == 2
    pool.reserve("second", 2)  # the leader agreed on no reuse (say another stage lacked it)
    assert pool.commit("second", hashes).num_registered == 0
    assert pool.materialize("second") == [2, 3]
    pool.publish("second", 8)
    pool.free("second")  # its private blocks go straight back to the free list
    assert pool.capacity().num_free == 6 and pool.capacity().num_pending == 2
    pool.check_integrity()


def test_publish_covers_full_blocks_only_is_idempotent_and_never_goes_back():
    pool = BlockPool(8, B)
    prompt = tokens(0, 2) + [1, 2]
    hashes = hash_blocks(prompt, B)
    pool.reserve("a", 3)
    pool.commit("a", hashes)
    pool.materialize("a")
    pool.publish("a", 7)
    assert pool.match(hashes).num_computed_blocks == 1
    pool.publish("a", 3)  # smaller: no-op
    assert pool.match(hashes).num_computed_blocks == 1
    pool.publish("a", 10)
    assert pool.match(hashes).num_computed_blocks == 2
    pool.check_integrity()


def test_release_at_every_state_returns_every_block():
    pool, x, f = full_pool_with_x_oldest()
    pool.lease("leased", x, 2)
    pool.lease("reserved", x, 1)
    pool.reserve("reserved", 2)
    pool.lease("committed", f, 2)
    pool.reserve("committed", 1)
    pool.commit("committed", hash_blocks(tokens(100, 2) + tokens(700, 1), B)[2:])
    pool.reserve("materialized", 1)
    pool.commit("materialized", hash_blocks(tokens(800, 1), B))
    pool.materialize("materialized")
    pool.check_integrity()
    for request_id in ("leased", "reserved", "committed", "materialized"):
        pool.release(request_id)
        pool.check_integrity()
    cap = pool.capacity()
    assert (cap.num_leased, cap.num_escrowed, cap.num_pending, cap.num_in_use) == (0, 0, 0, 0)
    assert cap.num_free + cap.num_evictable == 8
    assert pool.match(hash_blocks(tokens(800, 1), B)).num_blocks == 0  # never computed


def test_releasing_an_uncomputed_owner_leaves_a_dead_entry_to_its_reader():
    pool = BlockPool(8, B)
    prompt = tokens(0, 2)
    hashes = hash_blocks(prompt, B)
    longer = hash_blocks(prompt + tokens(40, 1), B)
    pool.reserve("owner", 2)
    pool.commit("owner", hashes)
    pool.materialize("owner")
    pool.lease("reader", hashes, 2)
    pool.reserve("reader", 1)
    pool.commit("reader", longer[2:])
    assert pool.match(longer).num_blocks == 3
    pool.release("owner")
    assert pool.match(longer).num_blocks == 0  # dead: neither the owner's nor the reader's
    cap = pool.capacity()
    assert (cap.num_leased, cap.num_pending, cap.num_escrowed, cap.num_free) == (2, 0, 1, 5)
    pool.check_integrity()
    with pytest.raises(PendingBlockError, match="released before"):
        pool.materialize("reader")
    pool.release("reader")
    assert pool.capacity().num_free == 8
    pool.check_integrity()


def test_lease_cap_counts_blocks_held_only_by_leases():
    pool = BlockPool(8, B, max_leased_blocks=3)
    hashes = hash_blocks(tokens(0, 4), B)
    cache_chain(pool, "a", tokens(0, 4))
    refused = pool.lease("big", hashes, 4)
    assert not refused.ok and "cap" in refused.reason and not pool.has_request("big")
    assert pool.lease("r1", hashes, 3).ok
    assert pool.lease("r2", hashes, 3).ok  # the same blocks: nothing new leased
    assert pool.capacity().num_leased == 3
    pool.reserve("w", 1)
    pool.commit("w", hash_blocks(tokens(300, 1), B))
    assert pool.lease("r3", hash_blocks(tokens(300, 1), B), 1).ok  # pending: its owner holds it
    pool.check_integrity()


def test_publish_inside_the_leased_prefix_computes_nothing_of_its_own():
    pool = BlockPool(8, B)
    prompt = tokens(0, 2)
    cache_chain(pool, "a", prompt)
    longer = hash_blocks(prompt + tokens(50, 3), B)
    pool.lease("b", longer, 2)
    pool.reserve("b", 3)
    pool.commit("b", longer[2:])
    pool.materialize("b")
    pool.publish("b", 4)  # inside the leased prefix
    assert pool.match(longer).num_computed_blocks == 2
    pool.publish("b", 12)
    assert pool.match(longer).num_computed_blocks == 3
    pool.check_integrity()
