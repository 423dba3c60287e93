"""The second tier of one stage's cache: copies of evicted blocks in host (CPU) memory.

When eviction takes a computed block out of the stage's GPU pool (an escrow materializes
its victims), the block goes to the host tier instead of vanishing: an *offload victim*. A
later request whose prefix runs past what the GPU pool holds may reuse the blocks the host
tier holds after it, at the price of copying them back:

    GPU pool   [0, g)         leased as usual
    host tier  [g, g + h)     loaded back into new GPU blocks (onboard), then reused
    computed   [g + h, ...)

The tier is an LRU over whole blocks, by bytes: each block costs `block_bytes`, plus
`snapshot_bytes` if it carries a recurrent-state snapshot (hybrid models: the state after
that block, offloaded with it). Past its capacity it drops the least recently used block.
Keys are the chain hashes of the blocks, so a key names its whole prefix; a chain found here
is the consecutive run of keys present.

A copy stays in the tier after it is loaded back (a second eviction of that block moves no
bytes). `transferred_bytes` counts every byte that crossed the host link, both directions;
`take_transferred_bytes` hands the count to whoever charges it and starts it again.
Pure Python, no tensors, deterministic.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from wavepp.cache.errors import IntegrityError, InvalidArgumentError


@dataclass(frozen=True, slots=True)
class HostLoad:
    """What one onboard moved: blocks and snapshots copied from the host tier to the GPU."""

    num_blocks: int
    num_snapshots: int
    num_bytes: int


class HostTier:
    """An LRU of offloaded blocks, by bytes; see the module docstring."""

    def __init__(self, capacity_bytes: int, block_bytes: int, snapshot_bytes: int = 0) -> None:
        if capacity_bytes < 0 or block_bytes <= 0 or snapshot_bytes < 0:
            raise InvalidArgumentError(
                f"HostTier needs capacity_bytes >= 0, block_bytes > 0 and snapshot_bytes >= 0, "
                f"got {capacity_bytes}, {block_bytes}, {snapshot_bytes}")
        self.capacity_bytes = capacity_bytes
        self.block_bytes = block_bytes
        self.snapshot_bytes = snapshot_bytes
        self._blocks: OrderedDict[int, bool] = OrderedDict()   # hash -> has a snapshot; LRU first
        self.used_bytes = 0
        self.transferred_bytes = 0
        self.num_offloaded = 0          # blocks copied in
        self.num_loaded = 0             # blocks copied back out
        self.num_dropped = 0            # blocks the LRU let go

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def offload(self, block_hash: int, has_snapshot: bool = False) -> None:
        """Keep a copy of an evicted block (and its snapshot). Mutates: the LRU order; copies
        and counts the bytes unless the tier holds that block already; drops the least
        recently used blocks past capacity (a block larger than the whole tier is not kept)."""
        held = self._blocks.get(block_hash)
        if held is not None:
            self._blocks.move_to_end(block_hash)
            if has_snapshot and not held:
                self._blocks[block_hash] = True
                self._grow(self.snapshot_bytes)
            return
        size = self._size(has_snapshot)
        if size > self.capacity_bytes:
            return
        self._blocks[block_hash] = has_snapshot
        self.num_offloaded += 1
        self._grow(size)

    def match(self, block_hashes: Sequence[int], start: int) -> int:
        """How many consecutive blocks from `start` the tier holds. Mutates nothing."""
        n = start
        while n < len(block_hashes) and block_hashes[n] in self._blocks:
            n += 1
        return n - start

    def snapshot_boundaries(self, block_hashes: Sequence[int], start: int, end: int) -> tuple[int, ...]:
        """Boundaries b in (start, end] (in blocks) whose block b - 1 the tier holds with its
        snapshot. Mutates nothing."""
        return tuple(b for b in range(start + 1, end + 1) if self._blocks.get(block_hashes[b - 1]))

    def onboard(self, block_hashes: Sequence[int], num_snapshots: int) -> HostLoad:
        """Copy `block_hashes` (all held here) and `num_snapshots` snapshots back to the GPU.
        Mutates: touches the blocks (most recently used), counts the bytes."""
        for block_hash in block_hashes:
            if block_hash not in self._blocks:
                raise InvalidArgumentError(f"onboard: block {block_hash} is not in the host tier")
            self._blocks.move_to_end(block_hash)
        num_bytes = len(block_hashes) * self.block_bytes + num_snapshots * self.snapshot_bytes
        self.num_loaded += len(block_hashes)
        self.transferred_bytes += num_bytes
        return HostLoad(len(block_hashes), num_snapshots, num_bytes)

    def take_transferred_bytes(self) -> int:
        """Bytes moved over the host link since the last call; the count starts again."""
        num_bytes, self.transferred_bytes = self.transferred_bytes, 0
        return num_bytes

    def check_integrity(self) -> None:
        used = sum(self._size(s) for s in self._blocks.values())
        if used != self.used_bytes:
            raise IntegrityError(f"host tier: {self.used_bytes} bytes counted, {used} held")
        if used > self.capacity_bytes:
            raise IntegrityError(f"host tier: {used} bytes held past a capacity of {self.capacity_bytes}")

    # ---- private helpers --------------------------------------------------------------------

    def _size(self, has_snapshot: bool) -> int:
        return self.block_bytes + (self.snapshot_bytes if has_snapshot else 0)

    def _grow(self, num_bytes: int) -> None:
        self.used_bytes += num_bytes
        self.transferred_bytes += num_bytes
        while self.used_bytes > self.capacity_bytes:
            _, had_snapshot = self._blocks.popitem(last=False)
            self.used_bytes -= self._size(had_snapshot)
            self.num_dropped += 1
