"""Recurrent-state snapshots as attachments of blocks: the pool of a hybrid model's stage.

A hybrid model's linear-attention layers keep one state per sequence, not per token, so a
prefix of k blocks can be resumed only where a stage saved that state after block k - 1: a
*snapshot*, attached to that block's entry. Snapshots live in `num_slots` slots of their own
(the runtime sizes them from the same memory budget as the blocks, with the page layout's
bytes per snapshot), and follow the blocks' round:

    match_snapshots(hashes, k)    hint: the longest prefix <= k ending at a snapshot, O(log k)
    lease(id, hashes, k)          also pins the snapshot at block k (refused if there is none)
    reserve_snapshots(id, plan)   escrow: one slot per boundary the request will save, plus
                                  one working slot it carries between its chunks
    commit(id, new_hashes)        a boundary on one of the request's new PENDING blocks becomes
                                  a PENDING snapshot: matchable and leasable before it is written
    publish(id, n_tokens)         boundaries <= n_tokens are written: pending ones are computed,
                                  the others attach their slot now if they can
    free / release(id)            unpin; give back the slots not attached; pending snapshots
                                  left unwritten die (their readers keep the slot until they go)

Pending snapshots are to snapshots what PENDING entries are to blocks (`cache/block.py`): a
request admitted while the request computing its prefix is in flight leases the snapshot its
owner will write; the leader plans its chunk after that boundary only once the owner's chunk
that writes it has been dispatched, and every stage runs waves in order, so the state is there
when the reader starts from it. A pending snapshot sits on a PENDING entry of its owner and is
computed at the same publish, or dies with it (`_on_unlink`).

Two kinds of snapshot. *Grid* snapshots sit at every `interval_blocks`-th boundary; along any
chain the grid snapshots present (pending or computed) form a prefix of the grid (one is
attached or registered only if the grid point before it has one, and one is evicted alone only
if no grid snapshot hangs below it), so the hint finds the last of them by exponential probe
plus binary search, as `PrefixIndex.match` finds blocks. *End* snapshots (the prompt's last
reusable boundary, off the grid) let a repeated prompt hit whatever its length; the hint
checks the one at k itself.

A snapshot leaves with its block (leaf-only block eviction: the deeper snapshots are gone
before) or before it, alone, when reserve needs slots: the least recently used unpinned
computed one that no grid snapshot hangs below. With a host tier, either way it leaves a copy
there (`HostTier.offload` with its block, `offload_snapshot` alone). Reserve evicts its
victims at once (not at materialize as blocks do): a snapshot is small, rounds need few.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

from wavepp.cache.block import BlockEntry
from wavepp.cache.block_log import SNAP_REMOVED, SNAP_STORED
from wavepp.cache.errors import InvalidArgumentError
from wavepp.cache.host_tier import HostTier
from wavepp.cache.pool import BlockPool
from wavepp.cache.results import CommitResult, LeaseResult, PoolRequestState, ReserveResult
from wavepp.cache.snapshot_integrity import check_snapshots
from wavepp.cache.snapshot_records import Snapshot, SnapshotMatch, SnapshotPlan


class SnapshotPool(BlockPool):
    """A `BlockPool` whose blocks may carry recurrent-state snapshots; see the module docstring."""

    keeps_snapshots = True

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        num_slots: int,
        interval_blocks: int,
        bytes_per_snapshot: int = 0,
        max_leased_blocks: int | None = None,
        host_tier: HostTier | None = None,
    ) -> None:
        if num_slots < 1 or interval_blocks < 1:
            raise InvalidArgumentError(
                f"SnapshotPool needs num_slots >= 1 and interval_blocks >= 1, "
                f"got {num_slots}, {interval_blocks}"
            )
        self.num_slots = num_slots
        self.interval_blocks = interval_blocks
        self.bytes_per_snapshot = bytes_per_snapshot
        self._snapshots: dict[int, Snapshot] = {}  # block hash -> snapshot after that block
        self._free_slots: list[int] = list(range(num_slots))
        self._plans: dict[Hashable, SnapshotPlan] = {}
        super().__init__(
            num_blocks, block_size, max_leased_blocks=max_leased_blocks, host_tier=host_tier
        )

    # ---- hints ------------------------------------------------------------------------------

    def match_snapshots(self, block_hashes: Sequence[int], num_blocks: int) -> SnapshotMatch:
        """The longest prefix of at most `num_blocks` blocks ending at a snapshot here. Mutates nothing."""
        snapshots, step = self._snapshots, self.interval_blocks
        num_points = num_blocks // step
        # grid points: [1, lo] present | (lo, hi) unknown | [hi, ...) absent
        lo, hi, j, num_lookups = 0, num_points + 1, 1, 0
        while j <= num_points:
            num_lookups += 1
            if block_hashes[j * step - 1] not in snapshots:
                hi = j
                break
            lo, j = j, j * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            num_lookups += 1
            if block_hashes[mid * step - 1] in snapshots:
                lo = mid
            else:
                hi = mid
        num_end = 0
        if num_blocks and num_blocks % step:
            num_lookups += 1
            if block_hashes[num_blocks - 1] in snapshots:
                num_end = num_blocks
        return SnapshotMatch(lo * step, num_end, num_lookups)

    def snapshot_slot(self, block_hash: int) -> int | None:
        snapshot = self._snapshots.get(block_hash)
        return None if snapshot is None else snapshot.slot

    # ---- admission --------------------------------------------------------------------------

    def lease(
        self, request_id: Hashable, block_hashes: Sequence[int], num_blocks: int
    ) -> LeaseResult:
        """As `BlockPool.lease`, and pin the snapshot after block `num_blocks` - 1 (not ok,
        holding nothing, if there is none: the request cannot resume there on this stage)."""
        snapshot = None
        if 0 < num_blocks <= len(block_hashes):
            snapshot = self._snapshots.get(block_hashes[num_blocks - 1])
            if snapshot is None:
                return LeaseResult(False, 0, f"no state snapshot after block {num_blocks - 1}")
        result = super().lease(request_id, block_hashes, num_blocks)
        if result.ok:
            plan = self._plans.setdefault(request_id, SnapshotPlan())
            if snapshot is not None:
                snapshot.ref_count += 1
                self._touch_snapshot(snapshot)
                plan.leased = snapshot
        return result

    def reserve_snapshots(self, request_id: Hashable, boundaries: Sequence[int]) -> ReserveResult:
        """Hold a slot for each boundary (in blocks) the request will save, plus its working
        slot. Free slots first (lowest id), then the least recently used evictable snapshots,
        evicted now. Not ok (holds nothing, evicts nothing) if too few. The request must be
        in the pool (after lease or reserve) and hold no slots yet."""
        self._get(request_id, "reserve_snapshots")
        plan = self._plans.setdefault(request_id, SnapshotPlan())
        if plan.slots or plan.pending or plan.working_slot is not None:
            raise InvalidArgumentError(
                f"reserve_snapshots: request {request_id!r} holds slots already"
            )
        needed = len(boundaries) + 1
        victims = self._snapshot_victims(needed - len(self._free_slots))
        if victims is None:
            return ReserveResult(
                False,
                0,
                (),
                f"need {needed} snapshot slots, {len(self._free_slots)} free and too few evictable",
            )
        for victim in victims:
            if self.host_tier is not None:  # its block stays here; the state goes to the host
                self.host_tier.offload_snapshot(victim.block_hash, victim.slot)
            self._drop_snapshot(victim)
        slots = [heapq.heappop(self._free_slots) for _ in range(needed)]
        plan.working_slot = slots[0]
        plan.slots = dict(zip(boundaries, slots[1:]))
        if self._requests[request_id].state is PoolRequestState.COMMITTED:
            self._register_pending(request_id)
        return ReserveResult(True, needed, tuple(slots))

    def commit(self, request_id: Hashable, new_block_hashes: Sequence[int]) -> CommitResult:
        """As `BlockPool.commit`; then each planned boundary that ends on one of the request's
        new PENDING entries (and, on the grid, whose grid parent is present) becomes a pending
        snapshot in its slot: later requests may match and lease it before it is written."""
        result = super().commit(request_id, new_block_hashes)
        if result.ok:
            self._register_pending(request_id)
        return result

    def cancel(self, request_id: Hashable) -> None:
        """As `BlockPool.cancel`; its pending snapshots die with its pending entries and every
        slot of its plan goes back (it may reserve blocks and slots anew); the lease stays."""
        super().cancel(request_id)
        plan = self._plans.get(request_id)
        if plan is not None:
            self._give_back_plan(plan)

    def snapshot_plan(self, request_id: Hashable) -> SnapshotPlan:
        return self._plans[request_id]

    # ---- execution --------------------------------------------------------------------------

    def publish(self, request_id: Hashable, num_computed_tokens: int) -> None:
        """As `BlockPool.publish`; then the pending snapshots now written are computed (their
        blocks were computed by the same call), and the other planned boundaries now written
        become snapshots of their blocks (or give their slot back, if the block is not cached
        and computed, already has a snapshot, or is a grid point whose grid parent has none)."""
        super().publish(request_id, num_computed_tokens)
        plan = self._plans.get(request_id)
        if plan is None:
            return
        for boundary in sorted(
            b for b in plan.pending if b * self.block_size <= num_computed_tokens
        ):
            snapshot = plan.pending.pop(boundary)
            snapshot.computed = True
            self._touch_snapshot(snapshot)
            self._log_snapshot(SNAP_STORED, snapshot)
        if not plan.slots:
            return
        request = self._requests[request_id]
        hashes = request.chain_hashes()
        done = [b for b in plan.slots if b * self.block_size <= num_computed_tokens]
        for boundary in sorted(done):
            slot = plan.slots.pop(boundary)
            if not self._attach(hashes, boundary, slot):
                heapq.heappush(self._free_slots, slot)

    def free(self, request_id: Hashable) -> None:
        super().free(request_id)
        self._retire_plan(request_id)

    def release(self, request_id: Hashable) -> None:
        super().release(request_id)
        self._retire_plan(request_id)

    def computed_snapshots(self) -> list[tuple[int, None]]:
        """Every computed snapshot, as (hash of its block, None) (BlockLog's whole set)."""
        return [(h, None) for h, snapshot in self._snapshots.items() if snapshot.computed]

    @property
    def num_snapshots(self) -> int:
        return len(self._snapshots)

    @property
    def num_pending_snapshots(self) -> int:
        return sum(1 for s in self._snapshots.values() if not s.computed)

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def snapshot_bytes_in_use(self) -> int:
        return (self.num_slots - len(self._free_slots)) * self.bytes_per_snapshot

    def check_integrity(self) -> None:
        super().check_integrity()
        check_snapshots(self)

    # ---- private helpers --------------------------------------------------------------------

    def _attach(self, hashes: list, boundary: int, slot: int) -> bool:
        if boundary > len(hashes) or hashes[boundary - 1] is None:
            return False
        block_hash = hashes[boundary - 1]
        entry = self._index.get(block_hash)
        if entry is None or not entry.computed or block_hash in self._snapshots:
            return False
        grid = boundary % self.interval_blocks == 0
        parent = None
        if grid and boundary > self.interval_blocks:
            parent = self._snapshots.get(hashes[boundary - self.interval_blocks - 1])
            if parent is None:
                return False  # keep the grid snapshots of every chain a prefix of the grid
        snapshot = Snapshot(block_hash, boundary, slot, grid, parent)
        if parent is not None:
            parent.num_grid_children += 1
        self._snapshots[block_hash] = snapshot
        self._touch_snapshot(snapshot)
        self._log_snapshot(SNAP_STORED, snapshot)
        return True

    def _touch_snapshot(self, snapshot: Snapshot) -> None:
        self._clock += 1
        snapshot.last_access = self._clock

    def _snapshot_victims(self, count: int) -> list[Snapshot] | None:
        """`count` snapshots to evict alone, least recently used first; None if too few.
        O(number of snapshots): a victim's parent may become evictable, so it walks in rounds."""
        if count <= 0:
            return []
        chosen: list[Snapshot] = []
        taken: set[int] = set()
        children_left: dict[int, int] = {}
        while len(chosen) < count:
            candidates = [
                s
                for s in self._snapshots.values()
                if id(s) not in taken
                and s.ref_count == 0
                and s.computed
                and s.num_grid_children - children_left.get(id(s), 0) == 0
            ]
            if not candidates:
                return None
            candidates.sort(key=lambda s: (s.last_access, -s.num_blocks, s.slot))
            for snapshot in candidates[: count - len(chosen)]:
                chosen.append(snapshot)
                taken.add(id(snapshot))
                if snapshot.parent is not None:
                    children_left[id(snapshot.parent)] = (
                        children_left.get(id(snapshot.parent), 0) + 1
                    )
        return chosen

    def _drop_snapshot(self, snapshot: Snapshot) -> None:
        del self._snapshots[snapshot.block_hash]
        self._log_snapshot(SNAP_REMOVED, snapshot)
        if snapshot.parent is not None:
            snapshot.parent.num_grid_children -= 1
        heapq.heappush(self._free_slots, snapshot.slot)

    def _log_snapshot(self, kind: int, snapshot: Snapshot) -> None:
        if self.block_log is not None:  # KV cache events: a computed snapshot came or went
            self.block_log.add(kind, snapshot.block_hash)

    def _has_snapshot(self, entry: BlockEntry) -> bool:
        snapshot = self._snapshots.get(entry.block_hash)  # type: ignore[arg-type]
        return snapshot is not None and snapshot.computed

    def _snapshot_slot_of(self, entry: BlockEntry) -> int | None:
        snapshot = self._snapshots.get(entry.block_hash)  # type: ignore[arg-type]
        return snapshot.slot if snapshot is not None and snapshot.computed else None

    def _on_unlink(self, entry: BlockEntry) -> None:
        # a block leaves the index: its snapshot goes with it (deeper ones went before); a
        # pending one on a block left unwritten dies
        snapshot = self._snapshots.get(entry.block_hash)  # type: ignore[arg-type]
        if snapshot is None:
            return
        if snapshot.computed:
            self._drop_snapshot(snapshot)
        else:
            self._kill(snapshot)

    def _register_pending(self, request_id: Hashable) -> None:
        """The request's planned boundaries on its own linked PENDING entries become pending
        snapshots (increasing, so a grid point's parent is registered before it)."""
        plan = self._plans[request_id]
        hashes = self._requests[request_id].chain_hashes()
        step = self.interval_blocks
        for boundary in sorted(plan.slots):
            if boundary > len(hashes):
                continue
            block_hash = hashes[boundary - 1]
            entry = self._index.get(block_hash)
            if (
                entry is None
                or entry.computed
                or entry.owner_id != request_id
                or not entry.owned
                or block_hash in self._snapshots
            ):
                continue
            grid = boundary % step == 0
            parent = None
            if grid and boundary > step:
                parent = self._snapshots.get(hashes[boundary - step - 1])
                if parent is None:
                    continue  # keep the grid snapshots of every chain a prefix of the grid
            snapshot = Snapshot(
                block_hash,
                boundary,
                plan.slots.pop(boundary),
                grid,
                parent,
                owner_id=request_id,
                computed=False,
            )
            if parent is not None:
                parent.num_grid_children += 1
            self._snapshots[block_hash] = snapshot
            self._touch_snapshot(snapshot)
            plan.pending[boundary] = snapshot

    def _kill(self, snapshot: Snapshot) -> None:
        """A pending snapshot will not be written: out of the map (and its pending grid
        children before it); its slot is free once nobody leases it. Idempotent."""
        if snapshot.dead:
            return
        if snapshot.num_grid_children:
            for child in [s for s in self._snapshots.values() if s.parent is snapshot]:
                self._kill(child)
        del self._snapshots[snapshot.block_hash]
        if snapshot.parent is not None:
            snapshot.parent.num_grid_children -= 1
        snapshot.dead = True
        owner = self._plans.get(snapshot.owner_id)
        if owner is not None and owner.pending.get(snapshot.num_blocks) is snapshot:
            del owner.pending[snapshot.num_blocks]
        if snapshot.ref_count == 0:
            heapq.heappush(self._free_slots, snapshot.slot)

    def _give_back_plan(self, plan: SnapshotPlan) -> None:
        """Pending snapshots die, planned and working slots go back to the free list."""
        for snapshot in list(plan.pending.values()):
            self._kill(snapshot)
        for slot in plan.held_slots():
            heapq.heappush(self._free_slots, slot)
        plan.slots, plan.pending, plan.working_slot = {}, {}, None

    def _retire_plan(self, request_id: Hashable) -> None:
        plan = self._plans.pop(request_id, None)
        if plan is None:
            return
        leased = plan.leased
        if leased is not None:
            leased.ref_count -= 1
            if not leased.dead:
                self._touch_snapshot(leased)
            elif leased.ref_count == 0:
                heapq.heappush(self._free_slots, leased.slot)
        self._give_back_plan(plan)
