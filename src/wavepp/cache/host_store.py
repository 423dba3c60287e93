"""Where a host tier's bytes live: the interface between `HostTier` (the bookkeeping, pure
Python) and a store of the blocks' bytes (the runtime's `HostKVStore`, torch).

    HostTier.offload   -> put(hash, block_id)    the tier starts holding an evicted block
    HostTier (its LRU) -> drop(hash)             the tier lets a block go
    HostTier.onboard   -> stage(hashes)          a copy of held blocks, taken now
    HostTier.land      -> load(staged, ids)      that copy written into GPU blocks

and, on a hybrid model, the same for the recurrent-state snapshots the tier keeps (a state
slot's contents, not a block's): put_state / drop_state / stage_states / load_states; a lease
that resumes before the blocks it loads also copies the stage's own blocks after that point
into the request's (stage_blocks, then load).

The tier calls the store exactly when its own bookkeeping changes, so the two never disagree;
without a store (the simulator, the cache's tests) the tier counts bytes and moves none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class HostBlockStore(Protocol):
    def put(self, block_hash: int, block_id: int) -> None:
        """Copy the bytes of the stage's block `block_id` (evicted now, not yet overwritten)
        into the store under `block_hash`. Must hold: the hash is not held yet, and the store
        has room (the tier drops what it must first)."""
        ...

    def drop(self, block_hash: int) -> None:
        """Let the bytes of `block_hash` go (their room is free for the next put)."""
        ...

    def stage(self, block_hashes: Sequence[int]) -> object:
        """A copy of the bytes of `block_hashes` (all held), in order, taken now: later drops
        and puts do not change it."""
        ...

    def load(self, staged: object, block_ids: Sequence[int]) -> None:
        """Write a `stage` copy into the stage's blocks `block_ids` (one per hash, in order).
        Must hold: no running wave reads or writes those blocks."""
        ...

    def put_state(self, block_hash: int, slot: int) -> None:
        """Copy the stage's state slot `slot` (the snapshot after block `block_hash`, leaving
        now, not yet overwritten) into the store."""
        ...

    def drop_state(self, block_hash: int) -> None:
        """Let the state of `block_hash` go."""
        ...

    def stage_states(self, block_hashes: Sequence[int]) -> object:
        """A copy of the states of `block_hashes` (all held), in order, taken now."""
        ...

    def load_states(self, staged: object, slots: Sequence[int]) -> None:
        """Write a `stage_states` copy into the stage's state slots `slots` (one per hash)."""
        ...

    def stage_blocks(self, block_ids: Sequence[int]) -> object:
        """A copy of the stage's own blocks `block_ids`, taken now (for `load` into others:
        materialize may evict these)."""
        ...
