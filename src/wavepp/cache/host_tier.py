"""The second tier of one stage's cache: copies of evicted blocks in host (CPU) memory.

When eviction takes a computed block out of the stage's GPU pool (an escrow materializes
its victims), the block goes to the host tier instead of vanishing: an *offload victim*. A
later request whose prefix runs past what the GPU pool holds may reuse the blocks the host
tier holds after it, at the price of copying them back:

    GPU pool   [0, g)         leased as usual
    host tier  [g, g + h)     loaded back into new GPU blocks (onboard), then reused
    computed   [g + h, ...)

The tier is an LRU over entries keyed by block, by bytes: a block costs `block_bytes`, its
recurrent-state snapshot (hybrid models: the state after that block) `snapshot_bytes`. A
snapshot comes with its block, or alone, earlier, when the GPU pool evicted the snapshot to
free its slot while keeping the block (`offload_snapshot`); the block joins it when it is
evicted in turn. Past its capacity the tier drops the least recently used entry. Keys are the
chain hashes of the blocks, so a key names its whole prefix; a chain found here is the
consecutive run of keys whose block is present.

A copy stays in the tier after it is loaded back (a second eviction of that block moves no
bytes). `transferred_bytes` counts every byte that crossed the host link, both directions;
`take_transferred_bytes` hands the count to whoever charges it and starts it again.
With a `block_log` (KV cache events), the blocks it starts and stops holding are recorded
there with their parents, and its snapshots (HOST_STORED ... HOST_SNAP_REMOVED);
`held_blocks` and `held_snapshots` are its whole sets.
Pure Python, no tensors, deterministic.

With a `HostBlockStore` (the runtime's) the tier also moves the bytes: it puts a block when it
starts holding it, drops it when the LRU lets it go, stages the blocks an onboard loads (a copy
taken at once, since the evictions that make room for them may drop them) and lands that copy
in the request's new blocks (`land`). Without one (the simulator) it only counts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from wavepp.cache.block_log import (
    HOST_REMOVED,
    HOST_SNAP_REMOVED,
    HOST_SNAP_STORED,
    HOST_STORED,
    BlockLog,
)
from wavepp.cache.errors import IntegrityError, InvalidArgumentError
from wavepp.cache.host_store import HostBlockStore


@dataclass(frozen=True, slots=True)
class HostLoad:
    """What one onboard moved: blocks and snapshots copied from the host tier to the GPU."""

    num_blocks: int
    num_snapshots: int
    num_bytes: int
    staged: object = None  # with a store: the blocks' bytes, copied out when onboard ran
    staged_states: object = None  # and the states of `onboard`'s state_hashes
    num_staged_states: int = 0


class HostTier:
    """An LRU of offloaded blocks, by bytes; see the module docstring."""

    def __init__(
        self,
        capacity_bytes: int,
        block_bytes: int,
        snapshot_bytes: int = 0,
        store: HostBlockStore | None = None,
    ) -> None:
        if capacity_bytes < 0 or block_bytes <= 0 or snapshot_bytes < 0:
            raise InvalidArgumentError(
                f"HostTier needs capacity_bytes >= 0, block_bytes > 0 and snapshot_bytes >= 0, "
                f"got {capacity_bytes}, {block_bytes}, {snapshot_bytes}"
            )
        self.capacity_bytes = capacity_bytes
        self.block_bytes = block_bytes
        self.snapshot_bytes = snapshot_bytes
        self.store = store  # the blocks' bytes (the runtime's); None: bookkeeping only
        # block hash -> (block held, snapshot held); least recently used first
        self._blocks: OrderedDict[int, tuple[bool, bool]] = OrderedDict()
        self._parents: dict[int, int | None] = {}  # of each block held
        self.block_log: BlockLog | None = None  # what it starts and stops holding (events)
        self.used_bytes = 0
        self.transferred_bytes = 0
        self.num_offloaded = 0  # blocks copied in
        self.num_loaded = 0  # blocks copied back out
        self.num_dropped = 0  # blocks the LRU let go (snapshots held alone not counted)

    def __len__(self) -> int:
        """Blocks held (snapshots held alone not counted)."""
        return sum(1 for block, _ in self._blocks.values() if block)

    def __contains__(self, block_hash: int) -> bool:
        return self._blocks.get(block_hash, (False, False))[0]

    def offload(
        self,
        block_hash: int,
        has_snapshot: bool = False,
        block_id: int | None = None,
        snapshot_slot: int | None = None,
        parent_hash: int | None = None,
    ) -> None:
        """Keep a copy of an evicted block (and its snapshot); `block_id`, `snapshot_slot`: the
        stage's block and state slot it leaves (a store copies their bytes from there before
        anything overwrites them); `parent_hash`: its parent's (None: a root). Mutates: the LRU
        order; copies and counts the bytes of what the tier does not hold yet; drops the least
        recently used entries past capacity (an entry larger than the whole tier is not kept)."""
        if self.store is not None and (
            block_id is None or (has_snapshot and snapshot_slot is None)
        ):
            raise InvalidArgumentError(
                f"offload: block {block_hash} needs its block_id and its snapshot's slot (a store)"
            )
        self._add(block_hash, True, has_snapshot, block_id, snapshot_slot, parent_hash)

    def offload_snapshot(self, block_hash: int, slot: int | None = None) -> None:
        """Keep a copy of a snapshot the GPU pool evicted alone (its block stays there);
        `slot`: its state slot (a store copies it from there)."""
        if self.store is not None and slot is None:
            raise InvalidArgumentError(f"offload_snapshot: {block_hash} needs its slot (a store)")
        self._add(block_hash, False, True, None, slot)

    def has_snapshot(self, block_hash: int) -> bool:
        """Whether the tier holds the snapshot after block `block_hash` (with the block or
        alone). Mutates nothing."""
        return self._blocks.get(block_hash, (False, False))[1]

    def held_blocks(self) -> list[tuple[int, int | None]]:
        """Every block held, as (hash, parent hash). Mutates nothing."""
        return list(self._parents.items())

    def held_snapshots(self) -> list[tuple[int, None]]:
        """Every snapshot held (with its block or alone), as (hash of its block, None)."""
        return [(block_hash, None) for block_hash, (_, snap) in self._blocks.items() if snap]

    def match(self, block_hashes: Sequence[int], start: int) -> int:
        """How many consecutive blocks from `start` the tier holds. Mutates nothing."""
        n = start
        while n < len(block_hashes) and block_hashes[n] in self:
            n += 1
        return n - start

    def snapshot_boundaries(
        self, block_hashes: Sequence[int], start: int, end: int
    ) -> tuple[int, ...]:
        """Boundaries b in (start, end] (in blocks) whose block b - 1 the tier holds with its
        snapshot. Mutates nothing."""
        return tuple(
            b
            for b in range(start + 1, end + 1)
            if self._blocks.get(block_hashes[b - 1], (False, False)) == (True, True)
        )

    def onboard(
        self, block_hashes: Sequence[int], num_snapshots: int, state_hashes: Sequence[int] = ()
    ) -> HostLoad:
        """Copy `block_hashes` (all held here) and `num_snapshots` snapshots back to the GPU;
        with a store, the snapshots are those after `state_hashes` (all held). Mutates:
        touches the blocks (most recently used), counts the bytes."""
        for block_hash in block_hashes:
            if block_hash not in self:
                raise InvalidArgumentError(f"onboard: block {block_hash} is not in the host tier")
            self._blocks.move_to_end(block_hash)
        for block_hash in state_hashes:
            if not self.has_snapshot(block_hash):
                raise InvalidArgumentError(f"onboard: no snapshot after {block_hash} held here")
        num_bytes = len(block_hashes) * self.block_bytes + num_snapshots * self.snapshot_bytes
        self.num_loaded += len(block_hashes)
        self.transferred_bytes += num_bytes
        if self.store is None:
            return HostLoad(len(block_hashes), num_snapshots, num_bytes)
        return HostLoad(
            len(block_hashes),
            num_snapshots,
            num_bytes,
            self.store.stage(block_hashes),
            self.store.stage_states(state_hashes) if state_hashes else None,
            len(state_hashes),
        )

    def land(
        self, load: HostLoad, block_ids: Sequence[int], state_slots: Sequence[int] = ()
    ) -> None:
        """Write what `onboard` staged into the stage's blocks `block_ids` (one per block
        loaded, in order) and its states into `state_slots` (one per state hash); nothing
        without a store. Must hold: no running wave reads or writes those blocks and slots
        (the request's new ones, before it publishes them)."""
        if len(block_ids) != load.num_blocks or (
            self.store is not None and len(state_slots) != load.num_staged_states
        ):
            raise InvalidArgumentError(
                f"land: {load.num_blocks} blocks and {load.num_staged_states} states loaded, "
                f"{len(block_ids)} block ids and {len(state_slots)} slots given"
            )
        if self.store is not None:
            self.store.load(load.staged, block_ids)
            if state_slots:
                self.store.load_states(load.staged_states, state_slots)

    def stage_own(self, block_ids: Sequence[int]) -> object:
        """A copy of the stage's own blocks `block_ids`, taken now, for `land_own` (a hybrid
        lease that resumes before the pool's prefix ends: those blocks go to the request's
        own, and materialize may evict them first); None without a store (no bytes)."""
        if self.store is None or not block_ids:
            return None
        return self.store.stage_blocks(block_ids)

    def land_own(self, staged: object, block_ids: Sequence[int]) -> None:
        """Write a `stage_own` copy into the stage's blocks `block_ids`."""
        if self.store is not None and staged is not None:
            self.store.load(staged, block_ids)

    def take_transferred_bytes(self) -> int:
        """Bytes moved over the host link since the last call; the count starts again."""
        num_bytes, self.transferred_bytes = self.transferred_bytes, 0
        return num_bytes

    def check_integrity(self) -> None:
        used = sum(self._size(*held) for held in self._blocks.values())
        if used != self.used_bytes:
            raise IntegrityError(f"host tier: {self.used_bytes} bytes counted, {used} held")
        if set(self._parents) != {h for h, (block, _) in self._blocks.items() if block}:
            raise IntegrityError("host tier: the parents kept are not those of the blocks held")
        if used > self.capacity_bytes:
            raise IntegrityError(
                f"host tier: {used} bytes held past a capacity of {self.capacity_bytes}"
            )

    # ---- private helpers --------------------------------------------------------------------

    def _log(
        self,
        block_hash: int,
        old: tuple[bool, bool],
        new: tuple[bool, bool],
        parent_hash: int | None = None,
    ) -> None:
        """What an entry's change starts or stops holding, to the block log (if any)."""
        log = self.block_log
        if log is None:
            return
        if old[0] != new[0]:
            log.add(HOST_STORED if new[0] else HOST_REMOVED, block_hash, parent_hash)
        if old[1] != new[1]:
            log.add(HOST_SNAP_STORED if new[1] else HOST_SNAP_REMOVED, block_hash)

    def _size(self, block: bool, snapshot: bool) -> int:
        return self.block_bytes * block + self.snapshot_bytes * snapshot

    def _add(
        self,
        block_hash: int,
        block: bool,
        snapshot: bool,
        block_id: int | None = None,
        snapshot_slot: int | None = None,
        parent_hash: int | None = None,
    ) -> None:
        old = self._blocks.pop(block_hash, (False, False))
        new = (old[0] or block, old[1] or snapshot)
        if self._size(*new) > self.capacity_bytes:
            if old != (False, False):
                self._blocks[block_hash] = old
            return
        self._blocks[block_hash] = new  # most recently used
        self.num_offloaded += new[0] and not old[0]
        num_bytes = self._size(*new) - self._size(*old)
        self.used_bytes += num_bytes
        self.transferred_bytes += num_bytes
        while self.used_bytes > self.capacity_bytes:  # (never the entry just added: it fits)
            dropped, held = self._blocks.popitem(last=False)
            self.used_bytes -= self._size(*held)
            self.num_dropped += held[0]
            if held[0]:
                del self._parents[dropped]
            self._log(dropped, held, (False, False))
            if self.store is not None and held[0]:
                self.store.drop(dropped)
            if self.store is not None and held[1]:
                self.store.drop_state(dropped)
        if new[0] and not old[0]:
            self._parents[block_hash] = parent_hash
        self._log(block_hash, old, new, parent_hash)
        if self.store is not None and new[0] and not old[0]:
            # after the drops: the store never holds more blocks than the tier has room for
            self.store.put(block_hash, block_id)  # type: ignore[arg-type]
        if self.store is not None and new[1] and not old[1]:
            self.store.put_state(block_hash, snapshot_slot)  # type: ignore[arg-type]
