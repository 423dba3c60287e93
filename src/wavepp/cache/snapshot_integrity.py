"""Full invariant check of a `SnapshotPool`'s snapshots, O(pool size); after `check_pool`.

1. slots partition exactly: free | held by a snapshot in the map (pending or computed) |
   held by a request's plan | held by a dead snapshot some request still leases
   (bytes in use = slots not free x bytes per snapshot)
2. every snapshot's block is in the index at depth boundary - 1 (none without its block):
   a computed snapshot's block is COMPUTED; a pending one's is a PENDING entry of its owner,
   which lists it in its plan, and vice versa
3. ref counts equal the live requests leasing the snapshot; a leased snapshot's block is
   leased; a dead leased snapshot's block is dead too (its readers go back to waiting)
4. grid snapshots: on the grid, their parent is the grid snapshot just before on the same
   chain (computed if they are), child counts match; off-grid snapshots have no parent
5. match_snapshots() equals a linear walk over the grid on the chain of every live request
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wavepp.cache.errors import IntegrityError

if TYPE_CHECKING:
    from collections.abc import Hashable

    from wavepp.cache.block import BlockEntry
    from wavepp.cache.snapshot_records import Snapshot, SnapshotPlan
    from wavepp.cache.snapshots import SnapshotPool


def check_snapshots(pool: SnapshotPool) -> None:
    """Raise IntegrityError naming the first invariant (1-5 above) that does not hold."""
    refs: dict[int, int] = {}  # id(snapshot) -> live requests leasing it
    dead: dict[int, Snapshot] = {}  # id(snapshot) -> a dead snapshot some request still leases
    for request_id, plan in pool._plans.items():
        _check_plan(pool, request_id, plan, refs, dead)
    _check_slots(pool, dead)
    for snap in dead.values():
        _check(
            snap.ref_count == refs[id(snap)],
            f"dead snapshot at {snap.num_blocks}: ref_count "
            f"{snap.ref_count}, leased by {refs[id(snap)]}",
        )
    children: dict[int, int] = {}  # id(grid snapshot) -> grid snapshots found on it
    for block_hash, snap in pool._snapshots.items():
        entry = pool._index.get(block_hash)
        if entry is None or not entry.linked:
            raise IntegrityError(f"snapshot at {snap.num_blocks} has no cached block")
        _check_attached(pool, snap, entry, refs)
        _check_grid(pool, snap, entry, children)
    for snap in pool._snapshots.values():
        _check(
            snap.num_grid_children == children.get(id(snap), 0),
            f"snapshot at {snap.num_blocks}: {snap.num_grid_children} grid children counted, "
            f"{children.get(id(snap), 0)} found",
        )
    _check_match(pool)


def _check_plan(
    pool: SnapshotPool,
    request_id: Hashable,
    plan: SnapshotPlan,
    refs: dict[int, int],
    dead: dict[int, Snapshot],
) -> None:
    """A request's plan: its lease (counted into refs; a dead one into dead) and its pending
    snapshots, each its own and in the map."""
    _check(
        pool.has_request(request_id),
        f"request {request_id!r} has snapshot slots but left the pool",
    )
    leased = plan.leased
    if leased is not None:
        refs[id(leased)] = refs.get(id(leased), 0) + 1
        if leased.dead:
            dead[id(leased)] = leased
            entry = pool._requests[request_id].leased[-1]
            _check(
                entry.block_hash == leased.block_hash and not entry.linked,
                f"request {request_id!r} leases a dead snapshot at {leased.num_blocks} "
                "on a live block",
            )
        else:
            _check(
                pool._snapshots.get(leased.block_hash) is leased,
                f"request {request_id!r} leases a snapshot at {leased.num_blocks} the pool lost",
            )
    for boundary, snap in plan.pending.items():
        _check(
            not snap.computed
            and not snap.dead
            and snap.owner_id == request_id
            and snap.num_blocks == boundary
            and pool._snapshots.get(snap.block_hash) is snap,
            f"request {request_id!r} lists a pending snapshot at {boundary} it does not own",
        )


def _check_slots(pool: SnapshotPool, dead: dict[int, Snapshot]) -> None:
    """Slots partition exactly into free and held; bytes in use follow the held ones."""
    free = list(pool._free_slots)
    held = [s.slot for s in pool._snapshots.values()] + [s.slot for s in dead.values()]
    for plan in pool._plans.values():
        held += plan.held_slots()
    every = free + held
    _check(
        len(set(every)) == len(every),
        "a snapshot slot is held twice (free, attached, planned or dead)",
    )
    _check(
        set(every) == set(range(pool.num_slots)), "a snapshot slot leaked: neither free nor held"
    )
    _check(
        pool.snapshot_bytes_in_use == len(held) * pool.bytes_per_snapshot,
        "snapshot bytes miscounted",
    )


def _check_attached(
    pool: SnapshotPool, snap: Snapshot, entry: BlockEntry, refs: dict[int, int]
) -> None:
    """A snapshot in the map and its block: state, owner, depth and leases agree."""
    _check(not snap.dead, f"dead snapshot at {snap.num_blocks} still in the map")
    if snap.computed:
        _check(entry.computed, f"computed snapshot at {snap.num_blocks} sits on a pending block")
    else:
        owner = pool._plans.get(snap.owner_id)
        _check(
            not entry.computed and entry.owned and entry.owner_id == snap.owner_id,
            f"pending snapshot at {snap.num_blocks} is not on a pending block of its owner",
        )
        _check(
            owner is not None and owner.pending.get(snap.num_blocks) is snap,
            f"pending snapshot at {snap.num_blocks}: owner {snap.owner_id!r} does not list it",
        )
    _check(
        entry.depth == snap.num_blocks - 1,
        f"snapshot at {snap.num_blocks} sits on a block of depth {entry.depth}",
    )
    _check(
        snap.ref_count == refs.get(id(snap), 0),
        f"snapshot at {snap.num_blocks}: ref_count {snap.ref_count}, "
        f"leased by {refs.get(id(snap), 0)}",
    )
    if snap.ref_count:
        _check(
            entry.ref_count > 0,
            f"leased snapshot at {snap.num_blocks} sits on an unleased block",
        )


def _check_grid(
    pool: SnapshotPool, snap: Snapshot, entry: BlockEntry, children: dict[int, int]
) -> None:
    """A grid snapshot past the first grid point has the one before it, on its own chain, as
    parent (counted into children); any other snapshot has no parent."""
    _check(snap.grid == (snap.num_blocks % pool.interval_blocks == 0), "grid flag off the grid")
    if not (snap.grid and snap.num_blocks > pool.interval_blocks):
        _check(snap.parent is None, f"snapshot at {snap.num_blocks} has a grid parent")
        return
    parent = snap.parent
    if parent is None or pool._snapshots.get(parent.block_hash) is not parent:
        raise IntegrityError(
            f"grid snapshot at {snap.num_blocks} without the grid snapshot before it"
        )
    _check(
        parent.computed or not snap.computed,
        f"computed grid snapshot at {snap.num_blocks} on a pending parent",
    )
    ancestor: BlockEntry | None = entry
    for _ in range(pool.interval_blocks):
        ancestor = ancestor.parent if ancestor is not None else None
    _check(
        ancestor is not None and ancestor.block_hash == parent.block_hash,
        "grid parent is not on the snapshot's chain",
    )
    children[id(parent)] = children.get(id(parent), 0) + 1


def _check_match(pool: SnapshotPool) -> None:
    """match_snapshots() equals a linear walk over the grid, on every live request's chain."""
    for request in pool._requests.values():
        hashes = request.chain_hashes()
        if None in hashes:
            continue
        step = pool.interval_blocks
        linear = 0
        for boundary in range(step, len(hashes) + 1, step):
            if hashes[boundary - 1] not in pool._snapshots:
                break
            linear = boundary
        got = pool.match_snapshots(hashes, len(hashes)).num_grid_blocks
        _check(got == linear, f"match_snapshots found grid {got}, a walk finds {linear}")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise IntegrityError(message)
