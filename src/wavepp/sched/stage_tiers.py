"""The tiers below one stage's pool, on that stage's side of the protocol: its host tier (the
pool's `host_tier`) and its view of the KV store every replica shares (`StoreTier`).

What they hold after the pool's prefix goes into the stage's hints (`held_after`, and a
hybrid model's `hybrid_hint` with the boundaries a load could resume at); what a lease will
need of the store is read before the stage's lock (`prefetch`); a lease whose agreed prefix runs
past the pool is loaded into new blocks (`lease`); and the full blocks a wave finished go to
the store (`publish`). `StageServer` holds one (`StageServer.tiers`) and asks it where the
pool alone does not answer.

Pure logic, no threads, as StageServer: the runtime serializes the calls (but `prefetch`, which
reads only what the last probe remembered and the store); the simulator calls it from its
event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from wavepp.cache.results import CommitResult
from wavepp.cache.snapshot_plan import snapshot_boundaries
from wavepp.cache.store_tier import StoreTier
from wavepp.sched.messages import Hint, ItemResult, LeaseItem, LeaseMsg, ProbeItem, ProbeMsg, Wave

if TYPE_CHECKING:
    from wavepp.cache import BlockPool, HostTier, SnapshotPool


@dataclass(frozen=True)
class TierLoad:
    """A lease the tiers loaded: the request's blocks (its cached prefix written into them) and
    how many of them came from a tier."""

    block_table: list[int]
    num_loaded_blocks: int


class StageTiers:
    def __init__(self, stage_id: int, pool: "BlockPool", store: StoreTier | None = None):
        self.stage_id = stage_id
        self.pool = pool
        self.store = store
        self.block_size = pool.block_size
        # the same pool, seen as a SnapshotPool, when it keeps snapshots (a hybrid model's)
        self._snapshots = cast("SnapshotPool", pool) if pool.keeps_snapshots else None
        self._store_runs: dict[int, tuple[int, int]] = {}  # probed: the store's run of blocks
        self.num_host_loaded_blocks = 0  # counters since start (metrics)

    @property
    def host(self) -> "HostTier | None":
        """The pool's host tier (the runtime may give the pool one after this was made)."""
        return self.pool.host_tier

    @property
    def any(self) -> bool:
        """Whether the stage has a tier below its pool."""
        return self.host is not None or self.store is not None

    # ---- what the tiers hold ---------------------------------------------------------------

    def held_after(self, item: ProbeItem, match, held: list[bool] | None) -> tuple[int, int]:
        """A model without states: the host tier's run of blocks right after the pool's prefix
        of `match`, then the store's after that, as (host blocks, store blocks). `held`: which
        of the prompt's blocks the store holds, asked before (None: asked here)."""
        num_host = self._host_blocks(item.block_hashes, match)
        start = match.num_blocks + num_host
        return num_host, self._store_blocks(item.block_hashes, match, start, held)

    def remember_runs(self, hints) -> None:
        """A probe's hints: the store's run of blocks, [start, end), of each prompt, for the
        prefetch of the lease that may follow."""
        for hint in hints:
            if hint.num_store_blocks:
                self._store_runs[hint.request_id] = (
                    hint.num_blocks - hint.num_store_blocks,
                    hint.num_blocks,
                )

    def forget(self, request_id: int | None = None) -> None:
        """Drop what a probe remembered: of one request, or (None) of every one."""
        if request_id is None:
            self._store_runs.clear()
        else:
            self._store_runs.pop(request_id, None)

    def hybrid_hint(self, item: ProbeItem, match) -> Hint:
        """A hybrid model's hint: the pool's snapshots (O(log n): the grid snapshots of a chain,
        pending ones too, form a prefix of the grid) and the boundaries after the pool's
        prefix where a load could resume: blocks held by the host tier, then the store, and
        the state there in either (`_loadable_points`)."""
        snapshots = cast("SnapshotPool", self._snapshots)
        hashes, num_blocks = item.block_hashes, match.num_blocks
        num_host = self._host_blocks(hashes, match)
        last_reusable = (item.num_tokens - 1) // self.block_size
        found = snapshots.match_snapshots(hashes, min(num_blocks, last_reusable))
        resume, start = found.num_blocks, num_blocks + num_host
        num_store, store_states = 0, []
        if self.store is not None and start < last_reusable:
            num_store = self._store_blocks(hashes, match, start)
            if num_store:  # the states of every boundary a load may cover, from `resume`
                store_states = self.store.states_held(hashes[resume : start + num_store])
        host = self.host

        def has_state(b: int) -> bool:
            if host is not None and host.has_snapshot(hashes[b - 1]):
                return True
            return 0 <= b - 1 - resume < len(store_states) and store_states[b - 1 - resume]

        end = min(start + num_store, last_reusable)
        points = tuple(b for b in range(num_blocks + 1, end + 1) if has_state(b))
        return Hint(
            item.request_id,
            start + num_store,
            self._loadable_points(resume, points, has_state) if points else (),
            snapshots.interval_blocks,
            found.num_grid_blocks,
            found.num_end_blocks,
            num_host,
            num_store,
        )

    def _loadable_points(self, resume: int, points: tuple[int, ...], has_state) -> tuple[int, ...]:
        """Of the boundaries `points` after the pool's prefix whose state a tier holds, those a
        request could resume at: a load from `resume` (the pool's last snapshot) to b writes
        the state of every grid boundary in (resume, b] too, so a tier must hold each of them
        (`has_state`; the ones at or before the pool's prefix are snapshots it evicted
        alone)."""
        step = cast("SnapshotPool", self._snapshots).interval_blocks
        grid = (resume // step + 1) * step  # the first grid boundary after resume
        out = []
        for point in points:
            while grid < point and has_state(grid):
                grid += step
            if grid < point:
                break  # a grid state before it is gone: no later point is loadable either
            out.append(point)
        return tuple(out)

    def _host_blocks(self, block_hashes, match) -> int:
        """Blocks the host tier holds right after the GPU prefix of `match`; 0 without a tier
        or when that prefix is not all computed here (a load lands after a computed block)."""
        host = self.host
        if host is None or match.num_computed_blocks < match.num_blocks:
            return 0
        return host.match(block_hashes, match.num_blocks)

    def _store_blocks(self, block_hashes, match, start: int, held=None) -> int:
        """Blocks the shared store holds from `start` (after the pool's and the host tier's);
        0 without a store or when the GPU prefix is not all computed here."""
        store = self.store
        if store is None or match.num_computed_blocks < match.num_blocks:
            return 0
        return store.match(block_hashes, start, held)

    # ---- before the stage's lock -----------------------------------------------------------

    def prefetch(self, msg, probed: dict[int, ProbeItem]) -> dict | None:
        """What a round message needs of the shared store, asked without the stage's lock (the
        caller holds none: the store is across a network, and the compute loop needs that
        lock). For a probe, which blocks of each prompt the store holds ({request id: [bool]});
        for a lease, the bytes of each item whose agreed prefix runs into the run of blocks its
        probe found in the store ({request id: (start, end, bytes)}), read from what the probe
        remembered (`probed`, the stage's; the same thread answers probes and leases); the
        lease uses them only if its own range is the same."""
        store = self.store
        if store is None or self._snapshots is not None:
            return None
        if isinstance(msg, ProbeMsg):  # which of each prompt's blocks the store holds
            return {item.request_id: store.held(item.block_hashes) for item in msg.items}
        if not isinstance(msg, LeaseMsg):
            return None
        fetched = {}
        for item in msg.items:
            probe = probed.get(item.request_id)
            run = self._store_runs.get(item.request_id)
            if probe is None or run is None or item.num_leased_blocks <= run[0]:
                continue
            start, end = run[0], min(run[1], item.num_leased_blocks)
            fetched[item.request_id] = (start, end, store.prefetch(probe.block_hashes[start:end]))
        return fetched

    # ---- a lease that runs past the pool ---------------------------------------------------

    def lease(
        self, item: LeaseItem, probed: ProbeItem, prefetched: tuple | None = None
    ) -> ItemResult | TierLoad:
        """The agreed prefix runs past the blocks this stage's GPU pool holds: lease the GPU
        part, load the rest from the host tier, then the store, into new blocks now, escrow
        room for the prompt after it. On failure hold nothing (the refusal's ItemResult).

            [0, resume)          leased (hybrid: the last snapshot boundary <= on_gpu, where it
                                 resumes; else on_gpu)
            [resume, on_gpu)     on the GPU beyond that boundary: pinned (borrowed) at commit
            [on_gpu, stored)     loaded from the host tier; with the states of the boundaries
                                 in (resume, agreed]
            [stored, agreed)     fetched from the shared store
            [agreed, ...)        computed by the request's chunks

        The loaded blocks are published at once (their KV is there before any wave reads
        them), so the request's own round is the last to see them pending. Their bytes are
        copied here, on the thread answering the round: the store's are fetched (and checked)
        first, before anything is held; the host tier's are copied out before materialize;
        both are written into the new blocks after it."""
        pool, hashes = self.pool, probed.block_hashes
        agreed, request_id = item.num_leased_blocks, item.request_id
        match = pool.match(hashes)
        on_gpu = match.num_blocks
        stored = on_gpu + min(self._host_blocks(hashes, match), agreed - on_gpu)
        fetched, reason = None, ""
        if match.num_computed_blocks < on_gpu or (stored < agreed and self.store is None):
            reason = f"blocks [{on_gpu}, {agreed}) are no longer in the host tier"
        elif stored < agreed:
            store = cast(StoreTier, self.store)
            if prefetched is not None and prefetched[:2] == (stored, agreed):
                fetched = store.fetch(hashes[stored:agreed], prefetched[2])
            else:  # the pool or the host tier changed since the probe: fetch it now
                fetched = store.fetch(hashes[stored:agreed])
            reason = f"blocks [{stored}, {agreed}) left the store or failed its checksum"
        if stored < agreed and fetched is None:
            return ItemResult(request_id, False, f"stage {self.stage_id}: {reason}")
        resume, boundaries, num_states = self._resume_plan(hashes, on_gpu, agreed, probed)
        commit, states = self._hold(item, hashes, resume, boundaries)
        if commit.ok and (
            (
                stored > on_gpu
                and cast("HostTier", self.host).match(hashes, on_gpu) < stored - on_gpu
            )
            or states is None
        ):
            # the states reserve evicted alone went to the tier, and it dropped some of these
            commit = CommitResult(
                False, reason=f"blocks [{on_gpu}, {stored}) left the host tier while room was made"
            )
        if not commit.ok or states is None:
            if pool.has_request(request_id):
                pool.release(request_id)
            return ItemResult(
                request_id, False, f"stage {self.stage_id}: tier load: {commit.reason}"
            )
        block_table = self._land(
            request_id, hashes, (resume, on_gpu, stored, agreed), (num_states, *states), fetched
        )
        pool.publish(request_id, agreed * self.block_size)
        return TierLoad(block_table, agreed - on_gpu)

    def _hold(self, item: LeaseItem, hashes, resume: int, boundaries):
        """Lease [0, resume), reserve the rest of the prompt (and the snapshots it saves),
        commit: the CommitResult, and the states a load writes (`_state_loads`; None when a
        tier lost one of them)."""
        pool, request_id = self.pool, item.request_id
        agreed = item.num_leased_blocks
        lease = pool.lease(request_id, hashes, resume)
        reserve = (
            pool.reserve(request_id, agreed - resume + item.num_new_blocks) if lease.ok else lease
        )
        if reserve.ok and self._snapshots is not None:
            reserve = self._snapshots.reserve_snapshots(request_id, boundaries)
        commit = pool.commit(request_id, hashes[resume:]) if reserve.ok else reserve
        states = self._state_loads(request_id, hashes, agreed) if commit.ok else ((), ())
        return commit, states

    def _resume_plan(self, hashes, on_gpu: int, agreed: int, probed: ProbeItem):
        """Where a tier load resumes (hybrid: the last snapshot boundary <= on_gpu; else
        on_gpu), the snapshot boundaries the request saves from there, and the states written
        back: the boundaries in (resume, agreed], and the one it resumes from at agreed."""
        snapshots = self._snapshots
        if snapshots is None:
            return on_gpu, (), 0
        resume = snapshots.match_snapshots(hashes, on_gpu).num_blocks
        boundaries = snapshot_boundaries(
            resume, probed.num_tokens, self.block_size, snapshots.interval_blocks
        )
        num_states = sum(1 for b in boundaries if b <= agreed) + int(agreed not in boundaries)
        return resume, boundaries, num_states

    def _state_loads(self, request_id, hashes, agreed: int):
        """Hybrid models: the snapshots a load writes, as (block hashes, state slots) from the
        host tier and (block hashes, state slots, fetched states) from the store: the state of
        every boundary the request saves at or before `agreed` into its slot, and the state at
        `agreed`, where it resumes, into its working slot. The host tier's first. None when
        neither holds one of them any more; empty for a model without states."""
        snapshots, host, store = self._snapshots, self.host, self.store
        if snapshots is None:
            return ((), ()), ((), (), None)
        plan = snapshots.snapshot_plan(request_id)
        save = plan.save_slots()
        loaded = sorted(b for b in save if b <= agreed)
        wanted = [(hashes[b - 1], save[b]) for b in loaded] + [
            (hashes[agreed - 1], plan.working_slot)
        ]
        from_host = [(h, s) for h, s in wanted if host is not None and host.has_snapshot(h)]
        from_store = [(h, s) for h, s in wanted if (h, s) not in from_host]
        fetched = None
        if from_store:
            if store is None:
                return None
            fetched = store.fetch_states([h for h, _ in from_store])
            if fetched is None:
                return None
        return tuple(zip(*from_host)) or ((), ()), (*(tuple(zip(*from_store)) or ((), ())), fetched)

    def _land(self, request_id, hashes, bounds, states, fetched) -> list[int]:
        """Materialize the request's blocks and write the loaded part into them: host blocks
        [on_gpu, stored) and their states (staged before materialize: its evictions may drop
        them from the tier), store blocks [stored, agreed) from `fetched` and the states
        fetched from the store; on a hybrid model that resumed before the pool's prefix ends,
        the pool's own blocks [resume, on_gpu), copied before materialize (it may evict
        them), into the request's."""
        resume, on_gpu, stored, agreed = bounds
        num_states, (state_hashes, state_slots), (_, store_slots, store_states) = states
        host, store = self.host, self.store
        own_ids = self.pool.block_ids(hashes[resume:on_gpu])
        load = None
        if host is not None:
            num_host_states = num_states - len(store_slots)
            load = host.onboard(hashes[on_gpu:stored], num_host_states, state_hashes)
            own = host.stage_own(own_ids)
        else:
            own = cast(StoreTier, store).stage_own(own_ids) if own_ids else None
        block_table = self.pool.materialize(request_id)  # evicts (offloads) its victims
        if load is not None:
            host = cast("HostTier", host)
            host.land(load, block_table[on_gpu:stored], state_slots)  # into victims' blocks
            host.land_own(own, block_table[resume:on_gpu])
            self.num_host_loaded_blocks += stored - on_gpu
        elif own is not None:
            cast(StoreTier, store).land_own(own, block_table[resume:on_gpu])
        if fetched is not None:
            cast(StoreTier, store).land(fetched, block_table[stored:agreed])
        if store_states is not None:
            cast(StoreTier, store).land_states(store_states, store_slots)
        return block_table

    # ---- after a wave ----------------------------------------------------------------------

    def publish(self, wave: Wave, requests: dict) -> None:
        """Hand the store every full block a chunk of `wave` finished here (blocks b with
        start < (b + 1) * block_size <= end) and, on a hybrid model, every state it saved at
        a block boundary. `requests`: the stage's (StageRequest by id). Nothing without a
        store."""
        store = self.store
        if store is None:
            return
        hashes: list[int] = []
        block_ids: list[int] = []
        state_hashes: list[int] = []
        slots: list[int] = []
        for chunk in wave.chunks:
            req = requests[chunk.request_id]
            table = cast("list[int]", req.block_table)
            last = min(chunk.end // self.block_size, len(req.block_hashes))
            for b in range(chunk.start // self.block_size, last):
                hashes.append(req.block_hashes[b])
                block_ids.append(table[b])
            if self._snapshots is not None:  # the states saved at boundaries in (start, end]
                for b, slot in self._snapshots.snapshot_plan(chunk.request_id).save_slots().items():
                    if chunk.start < b * self.block_size <= chunk.end:
                        state_hashes.append(req.block_hashes[b - 1])
                        slots.append(slot)
        store.publish(hashes, block_ids)
        store.publish_states(state_hashes, slots)

    def take_host_bytes(self) -> int:
        """Bytes this stage moved over its host link (loads and offloads) since the last call:
        the next wave here waits for them."""
        host = self.host
        return 0 if host is None else host.take_transferred_bytes()
