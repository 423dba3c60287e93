"""What a stage's pool did to its computed blocks (and snapshots) since it was last asked: the
record rank 0 turns into KV cache events for routers (`wavepp/kv_events/`).

    stored(hash, parent)     a block became COMPUTED and findable here (published, or loaded)
    removed(hash)            a computed block left the index (evicted, or the pool emptied)
    add(kind, hash, parent)  the same of the stage's host tier (cache/host_tier.py: a block
                             eviction copied there, or one its LRU let go) and of a hybrid
                             model's state snapshots (cache/snapshots.py), by kind
    drain() -> BlockChanges  the changes since the last drain, in the order they happened

The pool keeps its cached blocks closed under `parent` (leaf-only eviction, and a block is
published only after its parent), so in this order a parent is stored before its child and
removed after it. A block (or snapshot) evicted to the host tier is stored there before it is
removed from the pool, so a reader never sees it held nowhere in between. The record is
bounded: past `max_changes` changes not drained, it forgets them and the next drain carries
the stage's whole set instead (`resync`), which the reader compares with what it knew. Pure
Python, no locks: the pool's caller serializes it with the pool (the stage lock).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# What changed, where: a block or a recurrent-state snapshot (a hybrid model's: the state after
# that block), in the pool or in the stage's host tier; each REMOVED kind is its STORED kind + 1
STORED, REMOVED, HOST_STORED, HOST_REMOVED = 0, 1, 2, 3
SNAP_STORED, SNAP_REMOVED, HOST_SNAP_STORED, HOST_SNAP_REMOVED = 4, 5, 6, 7
WholeSet = Callable[[], list[tuple[int, int | None]]]  # (hash, parent hash or None) of each held


@dataclass(frozen=True)
class BlockChanges:
    """Changes of one stage's computed blocks and snapshots. `changes`: (a STORED kind, hash,
    parent hash or None; None for snapshots) and (a REMOVED kind, hash, None), in order.
    `resync`: the changes were too many to keep; `held` is then the stage's whole set as STORED
    changes (the pool's blocks parents first, then the rest), and the reader replaces what it
    knew of the stage with it (`changes` is empty)."""

    changes: tuple[tuple[int, int, int | None], ...] = ()
    resync: bool = False
    held: tuple[tuple[int, int, int | None], ...] = ()


class BlockLog:
    """The bounded record of one stage's computed-block changes; see the module docstring.

    `held_blocks`: the pool's computed blocks now, parents first; `others`: (STORED kind, its
    whole set) of what else the stage records here (its host tier's blocks, snapshots). Asked
    only on a resync."""

    def __init__(
        self,
        max_changes: int,
        held_blocks: WholeSet,
        others: Sequence[tuple[int, WholeSet]] = (),
    ) -> None:
        if max_changes < 1:
            raise ValueError(f"max_changes must be >= 1, got {max_changes}")
        self.max_changes = max_changes
        self._sources = [(STORED, held_blocks), *others]
        self._changes: list[tuple[int, int, int | None]] = []
        self._overflowed = False
        self.num_resyncs = 0  # drains that sent the whole set (a counter, for tests and metrics)

    def stored(self, block_hash: int, parent_hash: int | None) -> None:
        self._append((STORED, block_hash, parent_hash))

    def removed(self, block_hash: int) -> None:
        self._append((REMOVED, block_hash, None))

    def add(self, kind: int, block_hash: int, parent_hash: int | None = None) -> None:
        """A change of any kind (the host tier's, the snapshots')."""
        self._append((kind, block_hash, parent_hash))

    def drain(self) -> BlockChanges:
        """The changes since the last drain (or, after an overflow, the whole set); then empty."""
        if self._overflowed:
            self._overflowed = False
            self.num_resyncs += 1
            held = tuple(
                (kind, block_hash, parent)
                for kind, whole in self._sources
                for block_hash, parent in whole()
            )
            return BlockChanges(resync=True, held=held)
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


def attach_block_log(pool, max_changes: int) -> BlockLog:
    """A BlockLog for everything a stage's pool (a BlockPool, or a SnapshotPool) and its host
    tier (if it has one) hold, given to both; returned."""
    others: list[tuple[int, WholeSet]] = []
    if pool.keeps_snapshots:
        others.append((SNAP_STORED, pool.computed_snapshots))
    host = pool.host_tier
    if host is not None:
        others += [(HOST_STORED, host.held_blocks), (HOST_SNAP_STORED, host.held_snapshots)]
    log = BlockLog(max_changes, pool.computed_blocks, others)
    pool.block_log = log
    if host is not None:
        host.block_log = log
    return log
