"""The third tier of one stage's cache: a KV store every replica shares (Mooncake Store in the
runtime), below the stage's GPU pool and its host tier.

Each stage puts its layers' part of every full block it computes into the store as soon as it
is computed (`publish`), under a key that names the model, the stage's layer range, the dtype
and page layout (the tier's `namespace`) and the block's chain hash (which names its whole
prefix). Any stage with the same namespace, on any replica, may then reuse the block:

    GPU pool    [0, g)              leased as usual
    host tier   [g, g + h)          loaded back from host memory
    store       [g + h, g + h + s)  fetched from the store, checked, loaded into new blocks
    computed    [g + h + s, ...)

The store is not ours: it may drop an entry at any moment, be down, or hold bytes that no
longer match their key. So a probe's count is a hint, never a promise: `fetch` takes every
block of a load at once and checks each one (the store's checksum), and a load that misses
one block, or finds a bad one, is refused; the request tries again (and then computes what
the store no longer has). A stage with another layer split or dtype has another namespace
and finds nothing.

`StoreTier` keeps the keys, the counters and the order of calls; the bytes live behind a
`SharedBlockStore` (the runtime's over Mooncake Store, torch; the simulator's, bookkeeping
only). Pure Python, no tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from wavepp.cache.errors import InvalidArgumentError


class SharedBlockStore(Protocol):
    """Where a store tier's bytes live; keys are `StoreTier.key` strings."""

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is held now (False too when the store cannot be reached, or the
        entry was found bad before). Mutates nothing."""
        ...

    def fetch(self, keys: Sequence[str]) -> object | None:
        """The bytes of every key, each checked against its checksum, taken now; None when one
        is missing or bad (nothing is loaded then)."""
        ...

    def load(self, staged: object, block_ids: Sequence[int]) -> None:
        """Write a `fetch` result into the stage's blocks `block_ids` (one per key, in order).
        Must hold: no running wave reads or writes those blocks."""
        ...

    def put(self, keys: Sequence[str], block_ids: Sequence[int]) -> None:
        """Copy the bytes of the stage's blocks `block_ids` now (they may be reused after the
        call returns) and store them under `keys`, now or later (a put may be dropped: the
        store is a cache)."""
        ...

    def clear(self, prefix: str) -> None:
        """Drop every entry whose key starts with `prefix`, the puts queued before included."""
        ...

    def put_states(self, keys: Sequence[str], slots: Sequence[int]) -> None:
        """As `put`, for a hybrid model's recurrent states: the stage's state slots `slots`."""
        ...

    def fetch_states(self, keys: Sequence[str]) -> object | None:
        """As `fetch`, for states."""
        ...

    def load_states(self, staged: object, slots: Sequence[int]) -> None:
        """Write a `fetch_states` result into the stage's state slots `slots`."""
        ...

    def stage_blocks(self, block_ids: Sequence[int]) -> object:
        """A copy of the stage's own blocks `block_ids`, taken now, for `load` (a hybrid load
        that resumes before the pool's prefix ends)."""
        ...


_NOT_PREFETCHED = object()


@dataclass(frozen=True, slots=True)
class StoreLoad:
    """What one fetch took from the store: blocks, their bytes, and the staged copy."""

    num_blocks: int
    num_bytes: int
    staged: object = None


class StoreTier:
    """A stage's view of the shared store; see the module docstring."""

    def __init__(self, namespace: str, block_bytes: int, store: SharedBlockStore) -> None:
        if not namespace or block_bytes <= 0:
            raise InvalidArgumentError(
                f"StoreTier needs a namespace and block_bytes > 0, got {namespace!r}, {block_bytes}"
            )
        self.namespace = namespace
        self.block_bytes = block_bytes
        self.store = store
        self.num_loaded_blocks = 0  # blocks fetched and landed in the pool
        self.num_published_blocks = 0  # blocks handed to the store (a put may still drop them)
        self.num_refused_loads = 0  # fetches that missed a block or found a bad one
        self.transferred_bytes = 0  # both directions, since the last take_transferred_bytes

    def key(self, block_hash: int) -> str:
        return f"{self.namespace}/{block_hash & 0xFFFFFFFFFFFFFFFF:016x}"

    def state_key(self, block_hash: int) -> str:
        """The key of the recurrent state after block `block_hash` (hybrid models)."""
        return self.key(block_hash) + "/state"

    def states_held(self, block_hashes: Sequence[int]) -> list[bool]:
        """Whether the store holds the state after each block now (one query)."""
        if not block_hashes:
            return []
        return self.store.exists([self.state_key(h) for h in block_hashes])

    def publish_states(self, block_hashes: Sequence[int], slots: Sequence[int]) -> None:
        """The states after `block_hashes`, computed here into `slots`, go to the store; their
        bytes are copied before this returns."""
        if block_hashes:
            self.store.put_states([self.state_key(h) for h in block_hashes], slots)

    def fetch_states(self, block_hashes: Sequence[int]) -> object | None:
        """The states after `block_hashes`, checked; None (counted) when one is gone or bad."""
        if not block_hashes:
            return ()
        staged = self.store.fetch_states([self.state_key(h) for h in block_hashes])
        if staged is None:
            self.num_refused_loads += 1
        return staged

    def land_states(self, staged: object, slots: Sequence[int]) -> None:
        if slots:
            self.store.load_states(staged, slots)

    def held(self, block_hashes: Sequence[int]) -> list[bool]:
        """Whether the store holds each block now (one query for all of them)."""
        return self.store.exists([self.key(h) for h in block_hashes]) if block_hashes else []

    def match(
        self, block_hashes: Sequence[int], start: int, held: Sequence[bool] | None = None
    ) -> int:
        """How many consecutive blocks from `start` the store holds now (one query for all of
        them), or as `held` (a `held` of all of `block_hashes`, asked before) says. Mutates
        nothing here."""
        if start >= len(block_hashes):
            return 0
        if held is None:
            held = self.held(block_hashes[start:])
        else:
            held = held[start:]
        n = 0
        while n < len(held) and held[n]:
            n += 1
        return n

    def prefetch(self, block_hashes: Sequence[int]) -> object | None:
        """The store's answer for `block_hashes` (what `fetch` would take), counting nothing:
        a lease's bytes taken before the stage's lock, handed to `fetch` under it."""
        return self.store.fetch([self.key(h) for h in block_hashes]) if block_hashes else ()

    def fetch(
        self, block_hashes: Sequence[int], prefetched: object = _NOT_PREFETCHED
    ) -> StoreLoad | None:
        """Take the bytes of `block_hashes` from the store, checked (or use `prefetched`, a
        `prefetch` of the same hashes); None (counted) when one is missing or bad: the caller
        refuses the lease that wanted them."""
        if not block_hashes:
            return StoreLoad(0, 0)
        staged = (
            self.store.fetch([self.key(h) for h in block_hashes])
            if prefetched is _NOT_PREFETCHED
            else prefetched
        )
        if staged is None:
            self.num_refused_loads += 1
            return None
        num_bytes = len(block_hashes) * self.block_bytes
        self.transferred_bytes += num_bytes
        return StoreLoad(len(block_hashes), num_bytes, staged)

    def land(self, load: StoreLoad, block_ids: Sequence[int]) -> None:
        """Write a fetch into the stage's blocks `block_ids` (one per block, in order). Must
        hold: no running wave reads or writes them (the request's new ones, unpublished)."""
        if len(block_ids) != load.num_blocks:
            raise InvalidArgumentError(
                f"land: {load.num_blocks} blocks fetched, {len(block_ids)} block ids given"
            )
        if load.num_blocks:
            self.store.load(load.staged, block_ids)
            self.num_loaded_blocks += load.num_blocks

    def publish(self, block_hashes: Sequence[int], block_ids: Sequence[int]) -> None:
        """Blocks computed here (`block_ids`, named `block_hashes`) go to the store; their bytes
        are copied before this returns."""
        if len(block_hashes) != len(block_ids):
            raise InvalidArgumentError(
                f"publish: {len(block_hashes)} hashes for {len(block_ids)} blocks"
            )
        if block_hashes:
            self.store.put([self.key(h) for h in block_hashes], block_ids)
            self.num_published_blocks += len(block_hashes)
            self.transferred_bytes += len(block_hashes) * self.block_bytes

    def clear(self) -> None:
        """Drop every block of this namespace from the store (every replica's: a reset empties
        the caches, and the store's part of them is shared)."""
        self.store.clear(self.namespace + "/")

    def stage_own(self, block_ids: Sequence[int]) -> object:
        """A copy of the stage's own blocks `block_ids` (see `SharedBlockStore.stage_blocks`),
        for `land_own`."""
        return self.store.stage_blocks(block_ids) if block_ids else None

    def land_own(self, staged: object, block_ids: Sequence[int]) -> None:
        if staged is not None:
            self.store.load(staged, block_ids)

    def take_transferred_bytes(self) -> int:
        """Bytes moved to and from the store since the last call; the count starts again."""
        num_bytes, self.transferred_bytes = self.transferred_bytes, 0
        return num_bytes
