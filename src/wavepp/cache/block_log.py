"""What a stage's pool did to its computed blocks since it was last asked: the record rank 0
turns into KV cache events for routers (`wavepp/kv_events/`).

    stored(hash, parent)     a block became COMPUTED and findable here (published, or loaded)
    removed(hash)            a computed block left the index (evicted, or the pool emptied)
    host_stored(hash, parent) / host_removed(hash)
                             the same of the stage's host tier (cache/host_tier.py): a block
                             eviction copied there, or one its LRU let go
    drain() -> BlockChanges  the changes since the last drain, in the order they happened

The pool keeps its cached blocks closed under `parent` (leaf-only eviction, and a block is
published only after its parent), so in this order a parent is stored before its child and
removed after it. A block evicted to the host tier is stored there before it is removed from
the pool, so a reader never sees it held nowhere in between. The record is bounded: past `max_changes` changes not drained, it forgets
them and the next drain carries the pool's whole set of computed blocks instead (`resync`),
which the reader compares with what it knew. Pure Python, no locks: the pool's caller
serializes it with the pool (the stage lock).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

STORED, REMOVED, HOST_STORED, HOST_REMOVED = 0, 1, 2, 3


@dataclass(frozen=True)
class BlockChanges:
    """Changes of one stage's computed blocks. `changes`: (STORED or HOST_STORED, hash, parent
    hash or None) and (REMOVED or HOST_REMOVED, hash, None), in order. `resync`: the changes
    were too many to keep; `held` is then every computed block the pool holds as (hash, parent
    hash), parents first, `host_held` every block its host tier holds, and the reader replaces
    what it knew of the stage with them (`changes` is empty)."""

    changes: tuple[tuple[int, int, int | None], ...] = ()
    resync: bool = False
    held: tuple[tuple[int, int | None], ...] = ()
    host_held: tuple[tuple[int, int | None], ...] = ()


class BlockLog:
    """The bounded record of one pool's computed-block changes; see the module docstring.

    `held_blocks`: the pool's computed blocks now, parents first; `host_held_blocks`: its host
    tier's (None: it has none). Asked only on a resync."""

    def __init__(
        self,
        max_changes: int,
        held_blocks: Callable[[], list[tuple[int, int | None]]],
        host_held_blocks: Callable[[], list[tuple[int, int | None]]] | None = None,
    ) -> None:
        if max_changes < 1:
            raise ValueError(f"max_changes must be >= 1, got {max_changes}")
        self.max_changes = max_changes
        self._held_blocks = held_blocks
        self._host_held_blocks = host_held_blocks
        self._changes: list[tuple[int, int, int | None]] = []
        self._overflowed = False
        self.num_resyncs = 0  # drains that sent the whole set (a counter, for tests and metrics)

    def stored(self, block_hash: int, parent_hash: int | None) -> None:
        self._append((STORED, block_hash, parent_hash))

    def removed(self, block_hash: int) -> None:
        self._append((REMOVED, block_hash, None))

    def host_stored(self, block_hash: int, parent_hash: int | None) -> None:
        self._append((HOST_STORED, block_hash, parent_hash))

    def host_removed(self, block_hash: int) -> None:
        self._append((HOST_REMOVED, block_hash, None))

    def drain(self) -> BlockChanges:
        """The changes since the last drain (or, after an overflow, the whole set); then empty."""
        if self._overflowed:
            self._overflowed = False
            self.num_resyncs += 1
            host = self._host_held_blocks
            return BlockChanges(
                resync=True,
                held=tuple(self._held_blocks()),
                host_held=tuple(host()) if host is not None else (),
            )
        changes, self._changes = tuple(self._changes), []
        return BlockChanges(changes)

    def __len__(self) -> int:
        return len(self._changes)

    def _append(self, change: tuple[int, int, int | None]) -> None:
        if self._overflowed:
            return
        if len(self._changes) >= self.max_changes:
            self._changes = []  # the whole set goes at the next drain instead
            self._overflowed = True
            return
        self._changes.append(change)
