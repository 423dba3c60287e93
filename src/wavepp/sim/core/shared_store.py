"""The simulator's KV store shared by every replica (Mooncake Store in the runtime): bookkeeping
only, no bytes, no threads, deterministic.

One `SimSharedStore` holds the keys of every replica's stages, an LRU by bytes. Each stage
reaches it through a `SimStoreLink` of its own, the `SharedBlockStore` its `StoreTier` takes:
the link knows the size of that stage's blocks (an entry's size is taken at its put) and counts
what crossed it, so the pipeline can charge a stage's fetches to its next wave:

    SimSharedStore   keys -> bytes, least recently used first, capacity_bytes in all
      SimStoreLink   one per stage: block_bytes, fetches and puts since the last take
        StoreTier    one per stage: its namespace (the layer range), keys, counters

A put of a held key only touches it; a fetch of held keys touches them (most recently used) and
returns a token; a fetch that finds one key missing returns None and touches nothing. Past its
capacity the store drops the least recently used entries; an entry larger than the whole store
is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from wavepp.cache.errors import IntegrityError, InvalidArgumentError


class SimSharedStore:
    """An LRU of store entries by bytes, shared by every replica's stages; see the module
    docstring."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise InvalidArgumentError(
                f"SimSharedStore needs capacity_bytes >= 0, got {capacity_bytes}"
            )
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[str, int] = OrderedDict()  # key -> bytes; LRU first
        self.used_bytes = 0
        self.num_stored = 0  # entries put that the store did not hold yet
        self.num_dropped = 0  # entries the LRU let go

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def link(self, block_bytes: int) -> SimStoreLink:
        """A stage's way to the store, for its `StoreTier`: entries of `block_bytes` each."""
        return SimStoreLink(self, block_bytes)

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is held now. Mutates nothing."""
        return [key in self._entries for key in keys]

    def fetch(self, keys: Sequence[str]) -> tuple[str, ...] | None:
        """A token for every key, all held now, touched in order; None (nothing touched) when
        one is missing."""
        if any(key not in self._entries for key in keys):
            return None
        for key in keys:
            self._entries.move_to_end(key)
        return tuple(keys)

    def load(self, staged: object, block_ids: Sequence[int]) -> None:
        """Nothing to write: the simulator moves no bytes."""

    def put(self, keys: Sequence[str], block_bytes: int) -> None:
        """Hold `keys`, `block_bytes` each, in order: a held key is touched, a new one drops the
        least recently used entries until it fits (one larger than the store is not kept)."""
        for key in keys:
            if key in self._entries:
                self._entries.move_to_end(key)
                continue
            if block_bytes > self.capacity_bytes:
                continue
            while self.used_bytes + block_bytes > self.capacity_bytes:
                _, size = self._entries.popitem(last=False)
                self.used_bytes -= size
                self.num_dropped += 1
            self._entries[key] = block_bytes
            self.used_bytes += block_bytes
            self.num_stored += 1

    def clear(self, prefix: str) -> None:
        """Drop every entry whose key starts with `prefix`."""
        for key in [k for k in self._entries if k.startswith(prefix)]:
            self.used_bytes -= self._entries.pop(key)

    def check_integrity(self) -> None:
        used = sum(self._entries.values())
        if used != self.used_bytes or used > self.capacity_bytes:
            raise IntegrityError(
                f"SimSharedStore: entries hold {used} bytes, counted {self.used_bytes}, "
                f"capacity {self.capacity_bytes}"
            )


class SimStoreLink:
    """One stage's `SharedBlockStore` over a `SimSharedStore`: its entries are `block_bytes`
    each. Counts, since start and since the last `take_counts`, the fetches (refused ones too:
    each asked the store) and the bytes put."""

    def __init__(self, shared: SimSharedStore, block_bytes: int) -> None:
        if block_bytes <= 0:
            raise InvalidArgumentError(f"SimStoreLink needs block_bytes > 0, got {block_bytes}")
        self.shared = shared
        self.block_bytes = block_bytes
        self.num_fetches = 0
        self.num_fetched_bytes = 0
        self.num_put_bytes = 0
        self._taken = (0, 0)  # (num_fetches, num_put_bytes) at the last take_counts

    def exists(self, keys: Sequence[str]) -> list[bool]:
        return self.shared.exists(keys)

    def fetch(self, keys: Sequence[str]) -> tuple[str, ...] | None:
        self.num_fetches += 1
        staged = self.shared.fetch(keys)
        if staged is not None:
            self.num_fetched_bytes += len(keys) * self.block_bytes
        return staged

    def load(self, staged: object, block_ids: Sequence[int]) -> None:
        self.shared.load(staged, block_ids)

    def put(self, keys: Sequence[str], block_ids: Sequence[int]) -> None:
        self.num_put_bytes += len(keys) * self.block_bytes
        self.shared.put(keys, self.block_bytes)

    def clear(self, prefix: str) -> None:
        self.shared.clear(prefix)

    # a hybrid model's states and own-block copies move no bytes in the simulator (and
    # `SimSetup` refuses a hybrid model a store, as its costs do not charge states yet)
    def put_states(self, keys: Sequence[str], slots: Sequence[int]) -> None:
        """Nothing: see above."""

    def fetch_states(self, keys: Sequence[str]) -> tuple[str, ...] | None:
        return None

    def load_states(self, staged: object, slots: Sequence[int]) -> None:
        """Nothing: see above."""

    def stage_blocks(self, block_ids: Sequence[int]) -> object:
        return None

    def take_counts(self) -> tuple[int, int]:
        """(fetches, bytes put) since the last call; the counts start again."""
        fetches = self.num_fetches - self._taken[0]
        put_bytes = self.num_put_bytes - self._taken[1]
        self._taken = (self.num_fetches, self.num_put_bytes)
        return fetches, put_bytes
