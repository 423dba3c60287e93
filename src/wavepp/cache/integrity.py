"""Full invariant check of a `BlockPool`, O(pool size); tests call it after every operation.

Invariants, in the order checked:
  1. free ids are distinct, in range, and own no entry
  2. escrow victims are distinct, not free, unreferenced cached entries (or entries already
     out of the index, or ownerless blocks); a committed escrow holds all it needs; every
     linked child of a victim is a victim, and each entry lists exactly its victim children
  3. ref counts equal the number of holders (owner + leasing and borrowing requests); owners
     hold their own
  4. the index and the entries agree: hash, parent links, depth, child counts; PENDING
     entries have a live owner; COMPUTED entries have a block and a COMPUTED parent
  5. every physical block is in exactly one state and the counters match
  6. every evictable leaf is in the leaf queue, which yields the least recently used first
  7. match() == match_linear() on the chain of every live request
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wavepp.cache.block import BlockEntry, is_evictable_leaf, leaf_order
from wavepp.cache.errors import IntegrityError

if TYPE_CHECKING:
    from wavepp.cache.pool import BlockPool


def check_pool(pool: BlockPool) -> None:
    """Raise IntegrityError with the first broken invariant found; mutates nothing."""
    free_ids = set(pool._free_ids)
    _check(len(free_ids) == len(pool._free_ids), "free list holds a block id twice")
    for block_id in free_ids:
        _check(0 <= block_id < pool.num_blocks, f"free block id {block_id} out of range")
        _check(pool._block_entries[block_id] is None, f"free block {block_id} still has an entry")
    victim_owner = _check_escrows(pool, free_ids)
    entries = _check_refs(pool)
    children = _check_index(pool, entries)
    for entry in entries:
        linked_children = children.get(entry, []) if entry.linked else []
        victim_children = [c for c in linked_children if c.victim_of is not None]
        listed = entry.victim_children or []
        _check(
            len(listed) == len(victim_children) and set(listed) == set(victim_children),
            f"block {entry.block_id} lists {len(listed)} victim children, has {len(victim_children)}",
        )
        if entry.victim_of is not None and entry.linked:
            _check(
                len(victim_children) == len(linked_children),
                f"victim block {entry.block_id} has a non-victim child",
            )
    _check_block_states(pool, free_ids, victim_owner)
    # The leaf queue is lazy (stale items are dropped when they surface), so check what it
    # would yield: every evictable leaf has a live item, and the first valid item is the
    # least recently used evictable leaf.
    live_leaves = set(pool._leaves.items())
    evictable_leaves = [e for e in entries if is_evictable_leaf(e)]
    for entry in evictable_leaves:
        _check(
            entry in live_leaves,
            f"evictable leaf block {entry.block_id} missing from the leaf queue",
        )
    valid = [e for e in live_leaves if is_evictable_leaf(e)]
    if evictable_leaves:
        first, expected = min(valid, key=leaf_order), min(evictable_leaves, key=leaf_order)
        _check(
            first is expected,
            f"leaf queue yields block {first.block_id} before {expected.block_id}",
        )
    for request in pool._requests.values():
        hashes = request.chain_hashes()
        found, linear = pool.match(hashes), pool.match_linear(hashes)
        _check(
            found.num_blocks == linear,
            f"match {found.num_blocks} != linear {linear} for {request.request_id!r}",
        )
        computed = 0
        while computed < linear and pool._index[hashes[computed]].computed:
            computed += 1
        _check(
            found.num_computed_blocks == computed,
            f"match computed {found.num_computed_blocks} != {computed}",
        )


def _check_escrows(pool: BlockPool, free_ids: set[int]) -> dict[int, object]:
    victim_owner: dict[int, object] = {}
    for request_id, request in pool._requests.items():
        escrow = request.escrow
        if escrow is None:
            continue
        who = f"escrow of {request_id!r}"
        _check(len(escrow.victims) <= escrow.num_blocks, f"{who} holds more victims than it needs")
        _check(
            not escrow.committed or escrow.num_missing == 0, f"committed {who} is short of victims"
        )
        for block_id, entry in escrow.victims.items():
            _check(block_id not in victim_owner, f"block {block_id} is a victim of two escrows")
            _check(
                block_id not in free_ids, f"victim block {block_id} of {who} is on the free list"
            )
            victim_owner[block_id] = request_id
            _check(
                pool._block_entries[block_id] is entry,
                f"victim block {block_id} of {who} changed owner",
            )
            if entry is not None:
                _check(
                    entry.block_id == block_id and entry.victim_of == request_id,
                    f"victim {block_id} mislabeled",
                )
                _check(entry.ref_count == 0, f"victim block {block_id} of {who} is referenced")
                _check(entry.computed, f"victim block {block_id} of {who} is not computed")
    for entry in pool._block_entries:
        if entry is not None and entry.victim_of is not None:
            _check(
                entry.block_id in victim_owner,
                f"block {entry.block_id} marked victim but held by no escrow",
            )
    return victim_owner


def _check_refs(pool: BlockPool) -> set[BlockEntry]:
    holders: dict[BlockEntry, int] = {}
    for request_id, request in pool._requests.items():
        for depth, entry in enumerate(request.leased):
            _check(
                entry.depth == depth, f"{request_id!r} leased block {depth} has depth {entry.depth}"
            )
            holders[entry] = holders.get(entry, 0) + 1
        for i, entry in enumerate(request.borrowed):
            depth = len(request.leased) + i
            _check(
                entry.depth == depth and entry.computed,
                f"{request_id!r} borrowed block {depth} has depth {entry.depth} or is pending",
            )
            holders[entry] = holders.get(entry, 0) + 1
        for i, entry in enumerate(request.own):
            _check(
                entry.owned and entry.owner_id == request_id,
                f"{request_id!r} own block {i} not owned by it",
            )
            holders[entry] = holders.get(entry, 0) + 1
            if request.block_table is not None:
                expected = request.block_table[len(request.leased) + i]
                _check(
                    entry.block_id == expected,
                    f"{request_id!r} own block {i} is not block {expected}",
                )
            else:
                _check(
                    entry.block_id is None,
                    f"{request_id!r} own block {i} has a block before materialize",
                )
    entries = (
        set(holders) | set(pool._index.values()) | {e for e in pool._block_entries if e is not None}
    )
    for entry in entries:
        num_holders = holders.get(entry, 0)
        _check(
            entry.ref_count == num_holders,
            f"block {entry.block_id} ref_count {entry.ref_count} != {num_holders} holders",
        )
        if entry.owned:
            _check(
                entry.owner_id in pool._requests,
                f"block {entry.block_id} owned by gone {entry.owner_id!r}",
            )
        if entry.linked:
            _check(
                entry.block_hash is not None and pool._index.get(entry.block_hash) is entry,
                f"linked block {entry.block_id} not in the index",
            )
        elif num_holders == 0 and entry.block_id is not None and entry.victim_of is None:
            leaked = pool._block_entries[entry.block_id] is entry
            _check(not leaked, f"block {entry.block_id} leaked: unreferenced and not cached")
    return entries


def _check_index(pool: BlockPool, entries: set[BlockEntry]) -> dict[BlockEntry, list[BlockEntry]]:
    children: dict[BlockEntry, list[BlockEntry]] = {}
    for block_hash, entry in pool._index.items():
        _check(
            entry.block_hash == block_hash and entry.linked,
            f"index entry {block_hash:#x} mislabeled",
        )
        parent = entry.parent
        if parent is None:
            _check(entry.depth == 0, f"root block {entry.block_id} at depth {entry.depth}")
        else:
            _check(parent.linked, f"block {entry.block_id} cached under an evicted parent")
            _check(
                entry.depth == parent.depth + 1,
                f"block {entry.block_id} depth {entry.depth} under {parent.depth}",
            )
            children.setdefault(parent, []).append(entry)
        if entry.computed:
            _check(entry.block_id is not None, f"computed entry {block_hash:#x} has no block")
            _check(
                parent is None or parent.computed,
                f"computed block {entry.block_id} under a pending parent",
            )
        else:
            _check(entry.owned, f"pending entry {block_hash:#x} has no owner")
        if entry.block_id is not None:
            _check(
                pool._block_entries[entry.block_id] is entry,
                f"block {entry.block_id} map disagrees with index",
            )
    for entry in entries:
        num_children = len(children.get(entry, ()))
        _check(
            entry.num_children == num_children or not entry.linked,
            f"block {entry.block_id} counts {entry.num_children} children, has {num_children}",
        )
    return children


def _check_block_states(
    pool: BlockPool, free_ids: set[int], victim_owner: dict[int, object]
) -> None:
    counts = {"free": 0, "escrowed": 0, "in_use": 0, "leased": 0, "evictable": 0}
    for block_id, entry in enumerate(pool._block_entries):
        if block_id in free_ids:
            state = "free"
        elif block_id in victim_owner:
            state = "escrowed"
        elif entry is None:
            raise IntegrityError(f"block {block_id} leaked: not free, not escrowed, no entry")
        else:
            _check(
                entry.block_id == block_id,
                f"block {block_id} maps to an entry of block {entry.block_id}",
            )
            state = "in_use" if entry.owned else "leased" if entry.ref_count else "evictable"
            if state == "evictable":
                _check(
                    entry.linked and entry.computed, f"unreferenced block {block_id} is not cached"
                )
        counts[state] += 1
    view = pool.capacity()
    found = (view.num_free, view.num_escrowed, view.num_in_use, view.num_leased, view.num_evictable)
    _check(
        found == tuple(counts.values()),
        f"capacity {found} != counted {tuple(counts.values())} "
        "(free, escrowed, in_use, leased, evictable)",
    )
    _check(sum(counts.values()) == pool.num_blocks, "block states do not add up to num_blocks")
    num_pending = sum(1 for e in pool._index.values() if not e.computed)
    _check(
        view.num_pending == num_pending,
        f"num_pending {view.num_pending} != {num_pending} pending entries",
    )


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise IntegrityError(message)
