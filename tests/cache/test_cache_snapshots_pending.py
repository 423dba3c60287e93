"""Pending snapshots with tiny numbers (block size 2, a snapshot every 2 blocks): leased before
they are written, computed at their owner's publish, dead when the owner leaves first."""

import pytest

from wavepp.cache import PendingBlockError, SnapshotPool, hash_blocks, snapshot_boundaries

B = 2


def admit(pool: SnapshotPool, request_id: int, prompt: list[int]) -> int:
    """Probe (pending counted), lease, escrow blocks and slots, commit; returns blocks leased."""
    hashes = hash_blocks(prompt, B)
    k = min(pool.match(hashes).num_blocks, (len(prompt) - 1) // B)
    k = pool.match_snapshots(hashes, k).num_blocks
    assert pool.lease(request_id, hashes, k).ok
    assert pool.reserve(request_id, -(-len(prompt) // B) - k).ok
    assert pool.reserve_snapshots(
        request_id, snapshot_boundaries(k, len(prompt), B, pool.interval_blocks)
    ).ok
    assert pool.commit(request_id, hashes[k:]).ok
    pool.check_integrity()
    return k


A = list(range(9))  # 4 full blocks: saves at 2 and 4 (grid and last reusable)
FOLLOWER = A[:8] + [50, 51, 52]  # shares A's 4 blocks, saves at its last reusable 5


def test_a_follower_leases_the_snapshot_its_owner_has_not_written():
    pool = SnapshotPool(16, B, num_slots=6, interval_blocks=2)
    assert admit(pool, 1, A) == 0
    plan = pool.snapshot_plan(1)
    # working slot 0; boundaries 2 and 4 in slots 1 and 2, pending from the commit
    assert plan.working_slot == 0 and plan.slots == {} and plan.save_slots() == {2: 1, 4: 2}
    assert (
        pool.num_pending_snapshots == 2
        and pool.match_snapshots(hash_blocks(A, B), 4).num_grid_blocks == 4
    )
    assert admit(pool, 2, FOLLOWER) == 4  # the whole pending prefix
    follower = pool.snapshot_plan(2)
    assert (
        follower.leased is plan.pending[4]
        and follower.leased.slot == 2
        and follower.leased.ref_count == 1
    )
    assert follower.working_slot == 3 and follower.save_slots() == {5: 4}
    assert pool.materialize(1) == [0, 1, 2, 3, 4]
    assert pool.materialize(2) == [0, 1, 2, 3, 5, 6]
    with pytest.raises(PendingBlockError):
        pool.publish(2, 11)  # the state after block 3 is not there
    pool.publish(1, 4)
    pool.check_integrity()
    assert pool.num_pending_snapshots == 2 and plan.save_slots() == {
        4: 2
    }  # 2 written; 4 and 5 pending
    pool.publish(1, 9)
    assert follower.leased.computed and follower.leased.slot == 2
    pool.publish(2, 11)
    pool.free(1)
    pool.free(2)
    pool.check_integrity()
    assert pool.num_pending_snapshots == 0 and pool.num_snapshots == 3 and pool.num_free_slots == 3
    assert pool.snapshot_slot(hash_blocks(FOLLOWER, B)[4]) == 4


def test_an_owner_that_leaves_unwritten_kills_its_snapshot_and_its_readers_keep_the_slot():
    pool = SnapshotPool(16, B, num_slots=6, interval_blocks=2)
    admit(pool, 1, A)
    admit(pool, 2, FOLLOWER)
    pool.materialize(1)
    pool.publish(1, 4)  # boundary 2 written, 4 not
    pool.release(1)
    pool.check_integrity()
    leased = pool.snapshot_plan(2).leased
    assert leased.dead and not leased.computed and leased.ref_count == 1
    assert pool.match_snapshots(hash_blocks(A, B), 4).num_blocks == 2  # 2 stays, computed
    # free: A's working slot 0, the follower's pending 5 (slot 4, died with its block), 5;
    # slot 2 stays with the follower until it lets go
    assert sorted(pool._free_slots) == [0, 4, 5] and pool.num_pending_snapshots == 0
    with pytest.raises(PendingBlockError):
        pool.materialize(2)
    pool.release(2)
    pool.check_integrity()
    assert sorted(pool._free_slots) == [0, 2, 3, 4, 5] and pool.num_snapshots == 1


def test_a_readers_grid_snapshot_under_a_pending_parent_dies_with_it():
    pool = SnapshotPool(16, B, num_slots=8, interval_blocks=2)
    admit(pool, 1, A)
    reader = A[:8] + [60, 61, 62, 63, 64, 65]  # 7 blocks: saves at grid 6
    assert admit(pool, 2, reader) == 4
    six = pool.snapshot_plan(2).pending[6]
    assert six.parent is pool.snapshot_plan(1).pending[4] and six.parent.num_grid_children == 1
    pool.release(1)
    pool.check_integrity()
    assert (
        six.dead
        and pool.num_pending_snapshots == 0
        and pool.match_snapshots(hash_blocks(reader, B), 6).num_blocks == 0
    )
    pool.release(2)
    pool.check_integrity()
    assert pool.num_free_slots == 8


def test_pending_snapshots_are_never_evicted_and_cancel_gives_every_slot_back():
    pool = SnapshotPool(16, B, num_slots=3, interval_blocks=2)
    admit(pool, 1, A)  # all 3 slots: working, 2, 4
    assert pool.reserve(3, 1).ok
    assert not pool.reserve_snapshots(3, ()).ok  # unreferenced, but pending
    pool.release(3)
    pool.cancel(1)
    pool.check_integrity()
    assert pool.num_snapshots == 0 and pool.num_free_slots == 3
    assert pool.reserve(1, 5).ok and pool.reserve_snapshots(1, (2, 4)).ok  # it may reserve anew
    assert pool.num_pending_snapshots == 0  # not committed yet
    assert pool.commit(1, hash_blocks(A, B)).ok and pool.num_pending_snapshots == 2
    pool.materialize(1)
    pool.publish(1, 9)
    pool.free(1)
    # A's working slot is free again; a second slot evicts the snapshot at 4 (2 has a grid child)
    assert pool.reserve(3, 1).ok and pool.reserve_snapshots(3, (1,)).ok  # computed: evictable
    assert pool.num_snapshots == 1 and pool.match_snapshots(hash_blocks(A, B), 4).num_blocks == 2
    pool.release(3)
    pool.check_integrity()
