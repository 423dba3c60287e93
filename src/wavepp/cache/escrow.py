"""Capacity escrow: room for a request's new blocks, held without evicting anything yet.

A reservation holds `num_blocks` victims: free blocks first (lowest id), then evictable
leaves in LRU order. Cached victims stay in the prefix index, matchable and leasable, until
the request materializes; a lease that takes one "claims" it and the escrow needs a
replacement (at commit if not committed yet; at once, or the lease is refused, if committed).

Victims are exclusive (one escrow each), and a cached victim's linked children are always
victims of the same escrow: a leaf becomes one, and its parent is picked only after all its
children were, by the same escrow. So materialize can evict its victims deepest first, each a
leaf at that moment, and no other request's materialize can ever need them.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field

from wavepp.cache.block import BlockEntry, LeafQueue, is_evictable, leaf_order

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
    held: Mapping[int, BlockEntry | None],
    num_blocks: int,
    owner_id: Hashable,
    exclude: Collection[BlockEntry] = (),
) -> list[Victim]:
    """Take up to `num_blocks` victims for `owner_id`; fewer means not enough are claimable.

    Mutates: pops free ids from the `free_ids` heap, pops leaves from `leaves` and marks them
    `victim_of = owner_id`. The caller either keeps every pick or undoes them all with
    `unpick_victims`. held: the victims the escrow already has, treated as gone when deciding
    which parents are leaves now. exclude: entries that must not be picked (a lease in progress).
    """
    picks: list[Victim] = []
    while len(picks) < num_blocks and free_ids:
        picks.append((heapq.heappop(free_ids), None))
    if len(picks) == num_blocks:
        return picks
    # Parents whose every linked child is (or is about to be) a victim of this escrow: leaves
    # for this escrow only. Another escrow must not take them, or its materialize could evict
    # a parent while our victim child is still in the index.
    unlocked: list[tuple[int, int, int, BlockEntry]] = []
    num_gone_children: dict[BlockEntry, int] = {}

    def note_gone(entry: BlockEntry) -> None:
        parent = entry.parent
        if parent is None:
            return
        num_gone = num_gone_children.get(parent, 0) + 1
        num_gone_children[parent] = num_gone
        if num_gone == parent.num_children and is_evictable(parent) and parent not in exclude:
            heapq.heappush(unlocked, (*leaf_order(parent), parent))

    for entry in held.values():
        if entry is not None:
            note_gone(entry)
    skipped: list[BlockEntry] = []
    while len(picks) < num_blocks:
        leaf = leaves.peek()
        while leaf is not None and leaf in exclude:
            skipped.append(leaves.pop())  # type: ignore[arg-type]
            leaf = leaves.peek()
        if unlocked and (leaf is None or unlocked[0][:3] < leaf_order(leaf)):
            entry = heapq.heappop(unlocked)[3]
        elif leaf is not None:
            entry = leaves.pop()  # type: ignore[assignment]
        else:
            break
        entry.victim_of = owner_id
        picks.append((entry.block_id, entry))  # type: ignore[arg-type]
        note_gone(entry)
    for entry in skipped:
        leaves.offer(entry)
    return picks


def unpick_victims(free_ids: list[int], leaves: LeafQueue, picks: Collection[Victim]) -> None:
    """Give victims back: free ids to the free heap, cached entries to the evictable leaves."""
    for block_id, entry in picks:
        if entry is None:
            heapq.heappush(free_ids, block_id)
        else:
            entry.victim_of = None
    for _, entry in picks:
        if entry is not None:
            leaves.offer(entry)


def num_cached(picks: Collection[Victim]) -> int:
    return sum(1 for _, entry in picks if entry is not None)
