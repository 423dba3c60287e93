"""What a stage's pool did to its computed blocks since it was last asked: the record rank 0
turns into KV cache events for routers (`wavepp/kv_events/`).

    stored(hash, parent)     a block became COMPUTED and findable here (published, or loaded)
    removed(hash)            a computed block left the index (evicted, or the pool emptied)
    drain() -> BlockChanges  the changes since the last drain, in the order they happened

The pool keeps its cached blocks closed under `parent` (leaf-only eviction, and a block is
published only after its parent), so in this order a parent is stored before its child and
removed after it. The record is bounded: past `max_changes` changes not drained, it forgets
them and the next drain carries the pool's whole set of computed blocks instead (`resync`),
which the reader compares with what it knew. Pure Python, no locks: the pool's caller
serializes it with the pool (the stage lock).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

STORED, REMOVED = 0, 1


@dataclass(frozen=True)
class BlockChanges:
    """Changes of one stage's computed blocks. `changes`: (STORED, hash, parent hash or None)
    and (REMOVED, hash, None), in order. `resync`: the changes were too many to keep; `held` is
    then every computed block the pool holds as (hash, parent hash), parents first, and the
    reader replaces what it knew of the stage with it (`changes` is empty)."""

    changes: tuple[tuple[int, int, int | None], ...] = ()
    resync: bool = False
    held: tuple[tuple[int, int | None], ...] = ()


class BlockLog:
    """The bounded record of one pool's computed-block changes; see the module docstring.

    `held_blocks`: the pool's computed blocks now, parents first (asked only on a resync)."""

    def __init__(
        self, max_changes: int, held_blocks: Callable[[], list[tuple[int, int | None]]]
    ) -> None:
        if max_changes < 1:
            raise ValueError(f"max_changes must be >= 1, got {max_changes}")
        self.max_changes = max_changes
        self._held_blocks = held_blocks
        self._changes: list[tuple[int, int, int | None]] = []
        self._overflowed = False
        self.num_resyncs = 0  # drains that sent the whole set (a counter, for tests and metrics)

    def stored(self, block_hash: int, parent_hash: int | None) -> None:
        self._append((STORED, block_hash, parent_hash))

    def removed(self, block_hash: int) -> None:
        self._append((REMOVED, block_hash, None))

    def drain(self) -> BlockChanges:
        """The changes since the last drain (or, after an overflow, the whole set); then empty."""
        if self._overflowed:
            self._overflowed = False
            self.num_resyncs += 1
            return BlockChanges(resync=True, held=tuple(self._held_blocks()))
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
