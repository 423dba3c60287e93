"""Capacity escrow: room for a request's new blocks, held without evicting anything yet.

A reservation holds `num_blocks` victims: free blocks first (lowest id), then evictable
leaves in LRU order. A victim counts as gone already, so once every linked child of a block
is a victim the block is a leaf too and may be picked next, by this escrow or another. Cached
victims stay in the prefix index, matchable and leasable, until their escrow materializes;
a lease that takes one "claims" it and its escrow needs a replacement (at commit if not
committed yet; at once, or the lease is refused, if committed).

Victims are exclusive: one escrow each. Evicting a victim takes its whole subtree out of the
index (every block below a victim is a victim); victims of other escrows in it keep their
physical block, held for their own materialize.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Hashable
from dataclasses import dataclass, field

from wavepp.cache.block import BlockEntry, LeafQueue

Victim = tuple[int, "BlockEntry | None"]  # (block id, cached entry it holds, or None if free)


@dataclass(slots=True, eq=False)
class Escrow:
    """Victims held for one request: block id -> cached entry to evict, or None (free block).

    Insertion order is hand-out order at materialize: the request's new blocks get these
    block ids in this order.
    """

    num_blocks: int
    victims: dict[int, BlockEntry | None] = field(default_factory=dict)
    committed: bool = False

    @property
    def num_missing(self) -> int:
        return self.num_blocks - len(self.victims)


def pick_victims(
    free_ids: list[int],
    leaves: LeafQueue,
    num_blocks: int,
    owner_id: Hashable,
    exclude: Collection[BlockEntry] = (),
) -> list[Victim]:
    """Take up to `num_blocks` victims for `owner_id`; fewer means not enough are claimable.

    Mutates: pops free ids from the `free_ids` heap, pops leaves from `leaves` and marks them
    victims (see `mark_victim`). The caller keeps every pick or gives them all back.
    exclude: entries that must not be picked (the blocks a lease in progress pins).
    """
    picks: list[Victim] = []
    while len(picks) < num_blocks and free_ids:
        picks.append((heapq.heappop(free_ids), None))
    skipped = []
    while len(picks) < num_blocks:
        entry = leaves.pop()
        if entry is None:
            break
        if entry in exclude:
            skipped.append(entry)
            continue
        mark_victim(entry, owner_id, leaves)
        picks.append((entry.block_id, entry))  # type: ignore[arg-type]
    for entry in skipped:
        leaves.offer(entry)
    return picks


def mark_victim(entry: BlockEntry, owner_id: Hashable, leaves: LeafQueue) -> None:
    """`entry` becomes a victim of `owner_id`; its parent may become a leaf."""
    entry.victim_of = owner_id
    parent = entry.parent
    if parent is not None:
        if parent.victim_children is None:
            parent.victim_children = [entry]
        else:
            parent.victim_children.append(entry)
        leaves.offer(parent)


def unmark_victim(entry: BlockEntry) -> None:
    """`entry` (linked) stops being a victim: claimed by a lease, or given back."""
    entry.victim_of = None
    parent = entry.parent
    if parent is not None:
        _remove_victim_child(parent, entry)


def forget_victim_child(entry: BlockEntry) -> None:
    """`entry`, a victim, leaves the index: its parent stops counting it."""
    parent = entry.parent
    if parent is not None and entry.victim_of is not None:
        _remove_victim_child(parent, entry)


def num_cached(picks: Collection[Victim]) -> int:
    return sum(1 for _, entry in picks if entry is not None)


def _remove_victim_child(parent: BlockEntry, entry: BlockEntry) -> None:
    victim_children = parent.victim_children
    assert victim_children is not None
    for i, child in enumerate(victim_children):
        if child is entry:
            del victim_children[i]
            break
    if not victim_children:
        parent.victim_children = None
