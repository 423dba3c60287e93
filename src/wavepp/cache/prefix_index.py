"""The pool's blocks and entries, and the moves that keep them consistent.

`PrefixIndex` owns the prefix index (hash -> linked entry), the block map (block id -> entry
that owns the block), the free list, the evictable-leaf queue and the per-state counters.
Its moves take an entry or a block from one state to another and keep all of them in step:

    free --pick--> escrowed --materialize--> in use --owner frees--> evictable / free
                    ^   |                          (or leased, while readers hold it)
    evictable --pick+   +--give back--> evictable / free

`BlockPool` (pool.py) builds the request-level protocol on top.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from wavepp.cache.block import BlockEntry, LeafQueue
from wavepp.cache.block_log import BlockLog
from wavepp.cache.errors import InvalidArgumentError
from wavepp.cache.escrow import Victim, forget_victim_child, num_cached, unmark_victim
from wavepp.cache.host_tier import HostTier
from wavepp.cache.results import CapacityView, MatchResult


class PrefixIndex:
    """Blocks, entries and counters of one stage's pool; see the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, host_tier: HostTier | None = None) -> None:
        if num_blocks <= 0:
            raise InvalidArgumentError(f"num_blocks must be positive, got {num_blocks}")
        if block_size <= 0:
            raise InvalidArgumentError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.host_tier = (
            host_tier  # evicted computed blocks go there (offload victims); None: dropped
        )
        self._index: dict[int, BlockEntry] = {}  # hash -> linked entry
        self._block_entries: list[BlockEntry | None] = [
            None
        ] * num_blocks  # block id -> owner entry
        self._free_ids: list[int] = list(range(num_blocks))  # a heap: lowest id first
        self._leaves = LeafQueue()
        self._clock = 0  # logical time: ticks once per touched block
        self._num_evictable = 0
        self.num_evicted_blocks = 0  # entries evicted since start (a counter, for metrics)
        self._num_leased = 0
        self._num_escrowed = 0
        self._num_in_use = 0
        self._num_pending = 0
        # where its computed blocks' changes are recorded, for KV cache events (None: nowhere)
        self.block_log: BlockLog | None = None

    def match(self, block_hashes: Sequence[int]) -> MatchResult:
        """Longest prefix of `block_hashes` in the index (COMPUTED or PENDING). Mutates nothing.

        Exact in O(log n) lookups because presence is monotone along a chain: eviction takes
        leaves only and a PENDING entry's parent is held by its owner.
        """
        index = self._index
        num_hashes = len(block_hashes)
        # lengths: [1, lo] known present | (lo, hi) unknown | [hi, ...) known absent
        lo, hi, length, num_lookups = 0, num_hashes + 1, 1, 0
        last = None
        while length <= num_hashes:
            num_lookups += 1
            entry = index.get(block_hashes[length - 1])
            if entry is None:
                hi = length
                break
            lo, last, length = length, entry, length * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            num_lookups += 1
            entry = index.get(block_hashes[mid - 1])
            if entry is None:
                hi = mid
            else:
                lo, last = mid, entry
        if last is None or last.computed:
            return MatchResult(lo, num_lookups, lo)
        # Computed-ness is monotone too (an entry is published only after its parent).
        clo, chi = 0, lo - 1  # lengths [1, clo] computed | [chi + 1, lo] pending
        while chi > clo:
            mid = (clo + chi + 1) // 2
            num_lookups += 1
            if index[block_hashes[mid - 1]].computed:
                clo = mid
            else:
                chi = mid - 1
        return MatchResult(lo, num_lookups, clo)

    def block_ids(self, block_hashes: Sequence[int]) -> list[int]:
        """The stage's blocks holding `block_hashes` (all cached here). Mutates nothing."""
        return [self._index[h].block_id for h in block_hashes]  # type: ignore[misc]

    def match_linear(self, block_hashes: Sequence[int]) -> int:
        """Reference for `match`: walk the chain until the first absent hash."""
        for num_found, block_hash in enumerate(block_hashes):
            if block_hash not in self._index:
                return num_found
        return len(block_hashes)

    def computed_blocks(self) -> list[tuple[int, int | None]]:
        """Every computed block in the index as (hash, parent hash), parents first. O(n)."""
        held = [e for e in self._index.values() if e.computed]
        held.sort(key=lambda e: e.depth)
        return [
            (e.block_hash, None if e.parent is None else e.parent.block_hash)  # type: ignore[misc]
            for e in held
        ]

    def capacity(self) -> CapacityView:
        return CapacityView(
            num_free=len(self._free_ids),
            num_evictable=self._num_evictable,
            num_leased=self._num_leased,
            num_escrowed=self._num_escrowed,
            num_pending=self._num_pending,
            num_in_use=self._num_in_use,
            num_blocks=self.num_blocks,
        )

    # ---- moves ----------------------------------------------------------------------------

    def _hold(self, picks: list[Victim]) -> None:
        """Count fresh picks as escrowed (free and evictable blocks become escrowed)."""
        self._num_escrowed += len(picks)
        self._num_evictable -= num_cached(picks)

    def _give_back(self, victims: list[Victim]) -> None:
        """Held victims go back to the free list or the evictable leaves.

        Parents first: a cached victim whose parent is still another escrow's victim cannot
        stay in the index on its own (that parent will be evicted with its subtree), so it is
        evicted now and its block freed.
        """
        self._num_escrowed -= len(victims)
        ordered = sorted(victims, key=lambda v: -1 if v[1] is None else v[1].depth)
        for block_id, entry in ordered:
            if entry is None:
                heapq.heappush(self._free_ids, block_id)
                continue
            if entry.linked:
                unmark_victim(entry)
                parent = entry.parent
                if parent is None or parent.victim_of is None:
                    self._num_evictable += 1
                    self._leaves.offer(entry)
                    continue
                self._evict(entry)
            entry.victim_of = None
            self._free_block(entry)

    def _touch(self, entry: BlockEntry) -> None:
        """A use of the entry, for LRU: it gets the next tick of the logical clock."""
        self._clock += 1
        entry.last_access = self._clock

    def _pin(self, *, was_victim: bool) -> None:
        """A cached block gets its first reader: from an escrow's victims (`was_victim`) or
        from the evictable leaves, to leased."""
        if was_victim:
            self._num_escrowed -= 1
        else:
            self._num_evictable -= 1
        self._num_leased += 1

    def _unpin(self, entry: BlockEntry) -> None:
        """A leased block lost its last reader: cache it, or free its block."""
        self._num_leased -= 1
        self._settle_unreferenced(entry)

    def _escrow_to_in_use(self, num_blocks: int) -> None:
        """A request materialized: its escrowed blocks are now its own, in use."""
        self._num_escrowed -= num_blocks
        self._num_in_use += num_blocks

    def _owner_let_go(self, entry: BlockEntry) -> None:
        """The owner of an in-use block let go (its ref already dropped): readers keep it leased
        (cached-and-leased, or dead), else it is cached or freed."""
        self._num_in_use -= 1
        if entry.ref_count:
            self._num_leased += 1
        else:
            self._settle_unreferenced(entry)

    def _pending_registered(self, num_blocks: int) -> None:
        self._num_pending += num_blocks

    def _pending_computed(self, entry: BlockEntry) -> None:
        """A pending block was published: its tokens are computed, and it is touched."""
        entry.computed = True
        self._num_pending -= 1
        self._touch(entry)
        if self.block_log is not None and entry.linked:
            parent = entry.parent
            self.block_log.stored(
                entry.block_hash,  # type: ignore[arg-type]
                None if parent is None else parent.block_hash,
            )

    def _settle_unreferenced(self, entry: BlockEntry) -> None:
        """An entry with a block just lost its last ref: cache it, or free its block."""
        if entry.linked:
            self._num_evictable += 1
            self._leaves.offer(entry)
        else:
            self._free_block(entry)

    def _free_block(self, entry: BlockEntry) -> None:
        self._block_entries[entry.block_id] = None  # type: ignore[index]
        heapq.heappush(self._free_ids, entry.block_id)  # type: ignore[misc]
        entry.block_id = None

    def _evict(self, entry: BlockEntry) -> None:
        """Take a cached, unreferenced entry out of the index with its subtree (all victims:
        they keep their blocks, held by their escrows). Deepest first. With a host tier, each
        computed entry leaves a copy there (an offload victim)."""
        subtree = [entry]
        for node in subtree:  # grows while we walk it: breadth first
            if node.victim_children:
                subtree.extend(node.victim_children)
        self.num_evicted_blocks += len(subtree)
        for node in reversed(subtree):
            if self.host_tier is not None and node.computed:
                self.host_tier.offload(
                    node.block_hash,  # type: ignore[arg-type]
                    self._has_snapshot(node),
                    node.block_id,  # still this entry's: the copy is taken before reuse
                    self._snapshot_slot_of(node),
                    None if node.parent is None else node.parent.block_hash,
                )
            self._unlink(node)

    def _unlink(self, entry: BlockEntry) -> None:
        del self._index[entry.block_hash]  # type: ignore[arg-type]
        self._on_unlink(entry)
        forget_victim_child(entry)
        entry.linked = False
        if not entry.computed:
            self._num_pending -= 1
        elif self.block_log is not None:
            self.block_log.removed(entry.block_hash)  # type: ignore[arg-type]
        parent = entry.parent
        if parent is not None:
            parent.num_children -= 1
            if not parent.ref_count:
                self._leaves.offer(parent)

    def _has_snapshot(self, entry: BlockEntry) -> bool:
        """Whether the entry carries an attachment the host tier keeps with it (a computed
        recurrent-state snapshot, `SnapshotPool`)."""
        return False

    def _snapshot_slot_of(self, entry: BlockEntry) -> int | None:
        """The state slot of that attachment (None: none), read before the entry leaves."""
        return None

    def _on_unlink(self, entry: BlockEntry) -> None:
        """An entry left the index (evicted, or dropped uncomputed). Attachments of blocks
        (recurrent-state snapshots, `SnapshotPool`) leave with it."""

    def _maybe_compact(self) -> None:
        if len(self._leaves) > 2 * self._num_evictable + 1024:
            self._leaves.compact()
