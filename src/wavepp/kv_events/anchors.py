"""A hybrid model's anchors, for the KV cache events: where a request could resume.

A hybrid model's request resumes only at a block boundary where every stage holds the
recurrent-state snapshot after that block (in its pool or its host tier): an *anchor*. The
events announce a block held on every stage only if it leads to an anchor (it is one, or one of
its children held on every stage does), so a chain's announced part ends at its deepest anchor
and a router counts at least what a request reuses. It may count more where a request's prompt
leaves the chain between two anchors, or where the anchor is an off-grid snapshot (a prompt's
end), which the leader finds only for a prompt that ends there (`SnapshotPool.match_snapshots`).

    anchors.stored(stage, hash, host) / removed(...)   a stage's snapshot came or went: True
                                                        when the stages holding it changed
    anchors.recover(hash, whole, parent, changed)       bring `covered` up to date from a block
                                                        up its chain while the answer changes
    anchors.covered(hash)                               it leads to an anchor

Kept per block: whether it leads to one (`_covered`) and how many of its children held on every
stage do (`_ckids`), so a change walks up only while the answer changes. Pure, as
AllStageBlocks (all_stage_blocks.py), which holds one and says which blocks are held on every
stage (`whole`) and their parents.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from wavepp.cache.block_log import HOST_SNAP_STORED, SNAP_STORED


class Anchors:
    def __init__(self, num_stages: int) -> None:
        self.num_stages = num_stages
        self._snap: list[set[int]] = [set() for _ in range(num_stages)]  # in each stage's pool
        self._hsnap: list[set[int]] = [set() for _ in range(num_stages)]  # in its host tier
        self._reach: dict[int, int] = {}  # hash -> stages that hold its snapshot somewhere
        self._covered: set[int] = set()  # held on every stage and leading to an anchor
        self._ckids: dict[int, int] = {}  # hash -> its covered children (> 0)

    def stored(self, stage_id: int, block_hash: int, host: bool) -> bool:
        snaps = (self._hsnap if host else self._snap)[stage_id]
        if block_hash in snaps:
            return False
        had = self._holds(stage_id, block_hash)
        snaps.add(block_hash)
        if had:
            return False
        self._reach[block_hash] = self._reach.get(block_hash, 0) + 1
        return True

    def removed(self, stage_id: int, block_hash: int, host: bool) -> bool:
        snaps = (self._hsnap if host else self._snap)[stage_id]
        if block_hash not in snaps:
            return False
        snaps.discard(block_hash)
        if self._holds(stage_id, block_hash):
            return False
        reach = self._reach[block_hash] - 1
        if reach:
            self._reach[block_hash] = reach
        else:
            del self._reach[block_hash]
        return True

    def held(self, stage_id: int) -> Iterator[tuple[int, int]]:
        """A stage's snapshots as (STORED kind, hash): what a resync compares."""
        yield from ((SNAP_STORED, h) for h in self._snap[stage_id])
        yield from ((HOST_SNAP_STORED, h) for h in self._hsnap[stage_id])

    def covered(self, block_hash: int) -> bool:
        return block_hash in self._covered

    def recover(
        self,
        block_hash: int | None,
        whole: Callable[[int], bool],
        parent: Callable[[int], int | None],
        changed: Callable[[int], None],
    ) -> None:
        """A block's holding or snapshots changed (`whole(h)`: held on every stage now;
        `parent(h)`: its parent's hash, known while some stage holds it): update `covered`
        from it up its chain while the answer changes, calling `changed(h)` for each block
        whose answer did (in that order: a block, then its parent)."""
        while block_hash is not None:
            covered = self._leads_to_anchor(block_hash, whole)
            if covered == (block_hash in self._covered):
                return
            if covered:
                self._covered.add(block_hash)
            else:
                self._covered.discard(block_hash)
            changed(block_hash)
            up = parent(block_hash)
            if up is not None:
                ckids = self._ckids.get(up, 0) + (1 if covered else -1)
                if ckids:
                    self._ckids[up] = ckids
                else:
                    del self._ckids[up]
            block_hash = up

    def state_size(self) -> int:
        return len(self._reach) + len(self._covered) + len(self._ckids)

    def check_integrity(
        self, held: list[tuple[int, int | None]], whole: Callable[[int], bool]
    ) -> None:
        """`held`: (hash, parent) of every block some stage holds."""
        reach: dict[int, int] = {}
        for snap, hsnap in zip(self._snap, self._hsnap):
            for block_hash in snap | hsnap:
                reach[block_hash] = reach.get(block_hash, 0) + 1
        assert reach == self._reach, "per-hash snapshot reach differs from the stages' sets"
        parents = dict(held)
        ckids: dict[int, int] = {}
        for block_hash in self._covered:
            up = parents[block_hash]
            if up is not None:
                ckids[up] = ckids.get(up, 0) + 1
        assert ckids == self._ckids, "covered children counts differ"
        for block_hash in parents:
            assert (block_hash in self._covered) == self._leads_to_anchor(block_hash, whole), (
                f"{block_hash}: covered is stale"
            )

    def _holds(self, stage_id: int, block_hash: int) -> bool:
        return block_hash in self._snap[stage_id] or block_hash in self._hsnap[stage_id]

    def _leads_to_anchor(self, block_hash: int, whole: Callable[[int], bool]) -> bool:
        """Held on every stage, and an anchor itself or the parent of a covered child."""
        return whole(block_hash) and (
            self._reach.get(block_hash) == self.num_stages or self._ckids.get(block_hash, 0) > 0
        )
