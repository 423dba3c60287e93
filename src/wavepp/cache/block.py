"""The block record and the queue of evictable leaves.

A `BlockEntry` is one block of one prompt chain as this stage knows it. It exists from the
moment a request commits to computing it (PENDING, maybe no physical block yet) until
nobody needs it: evicted if cached, freed if never computed or private.

    linked     in the prefix index under block_hash: matchable and leasable
    computed   its KV is written and published (else PENDING: its owner will write it)
    owned      its owner request still holds it (one of the ref_count refs)
    block_id   physical block, None until the owner materializes

Leaf-only eviction keeps the linked entries closed under `parent`: every prompt's cached
blocks form a prefix of it. An escrow victim counts as gone already: a cached block whose
linked children are all victims is a leaf, and a victim's linked children are all victims
(so evicting one takes its subtree, all victims, out of the index at once). `LeafQueue`
orders the evictable leaves (linked, computed, ref_count 0, not a victim, every linked child
a victim) by (last_access, deeper first, block id).
It is a heap with lazy deletion: an entry that stops being a leaf keeps its stale heap item
until that item surfaces and is dropped, so every state change stays O(1) or O(log n).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class BlockEntry:
    """One block of a prompt chain on this stage (identity-compared, mutable, pool-private)."""

    block_hash: int | None  # None: private block (deduplicated, or the partial last block)
    parent: BlockEntry | None  # previous block of the chain; None at depth 0
    depth: int  # index of the block in its prompt
    owner_id: Hashable  # the request that committed to compute it
    block_id: int | None = None
    computed: bool = False
    linked: bool = False
    owned: bool = True
    ref_count: int = 1  # the owner's ref, plus one per leasing request
    num_children: int = 0  # linked entries whose parent is this one
    victim_children: list[BlockEntry] | None = None  # those of them that are escrow victims
    last_access: int = -1  # logical clock of the last lease or publish
    leaf_key: int = -2  # last_access of this entry's live item in LeafQueue, -2 if none
    victim_of: Hashable = None  # request whose escrow holds this block as a victim


def is_evictable(entry: BlockEntry) -> bool:
    """Cached KV nobody holds: eviction may take it once it is a leaf."""
    return entry.ref_count == 0 and entry.victim_of is None and entry.linked and entry.computed


def is_evictable_leaf(entry: BlockEntry) -> bool:
    victim_children = entry.victim_children
    num_victims = len(victim_children) if victim_children else 0
    return entry.num_children == num_victims and is_evictable(entry)


def leaf_order(entry: BlockEntry) -> tuple[int, int, int | None]:
    """Eviction order: least recently used first, then deeper first, then lower block id."""
    return (entry.last_access, -entry.depth, entry.block_id)


class LeafQueue:
    """Evictable leaves by `leaf_order`, with lazy deletion.

    offer(entry): call whenever an entry may have become an evictable leaf; a no-op otherwise.
    peek() / pop(): the first evictable leaf, skipping and dropping stale items.
    An entry's item is live when its key matches the entry's current last_access; an entry
    has at most one live item (tracked by `leaf_key`), so offering twice pushes once.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int | None, BlockEntry]] = []

    def __len__(self) -> int:
        """Heap items, stale ones included."""
        return len(self._heap)

    def offer(self, entry: BlockEntry) -> None:
        # is_evictable_leaf inlined, cheapest "no" first: this runs for every touched parent
        if entry.ref_count or entry.victim_of is not None or not entry.computed or not entry.linked:
            return
        victim_children = entry.victim_children
        if entry.num_children != (len(victim_children) if victim_children else 0):
            return
        if entry.leaf_key != entry.last_access:
            entry.leaf_key = entry.last_access
            item = (entry.last_access, -entry.depth, entry.block_id, entry)
            heapq.heappush(self._heap, item)

    def peek(self) -> BlockEntry | None:
        heap = self._heap
        while heap:
            last_access, _, block_id, entry = heap[0]
            if entry.last_access == last_access and entry.block_id == block_id:
                if is_evictable_leaf(entry):
                    return entry
                entry.leaf_key = _NO_ITEM
            heapq.heappop(heap)
        return None

    def pop(self) -> BlockEntry | None:
        entry = self.peek()
        if entry is not None:
            heapq.heappop(self._heap)
            entry.leaf_key = _NO_ITEM
        return entry

    def contains(self, entry: BlockEntry) -> bool:
        """Whether `entry` has a live item (O(1), used by integrity checks)."""
        return entry.leaf_key == entry.last_access

    def compact(self) -> None:
        """Drop every stale item; O(n). The pool calls it when stale items dominate."""
        live = []
        for item in self._heap:
            entry = item[3]
            if entry.last_access == item[0] and entry.block_id == item[2]:
                if is_evictable_leaf(entry):
                    live.append(item)
                else:
                    entry.leaf_key = _NO_ITEM
        heapq.heapify(live)
        self._heap = live

    def items(self) -> list[BlockEntry]:
        """Entries with a live item, in heap (not sorted) order; for integrity checks."""
        return [
            item[3] for item in self._heap if item[0] == item[3].leaf_key == item[3].last_access
        ]


_NO_ITEM = -2  # leaf_key of an entry with no live item; never a clock value
