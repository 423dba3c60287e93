"""One stage's side of the protocol: answers admission rounds from its own BlockPool, and
prepares / completes the waves that reach it.

The leader decides *what* to run; each stage checks the plan against its own state before it
runs it: a chunk must start exactly where this stage's copy of the request stopped, and the
reused prefix must be computed here. A mismatch raises PlanMismatchError with both views,
never silent divergence.

Pure logic, no threads: the runtime serializes calls (WAVE answers rounds, LOOP runs waves,
under one lock); the simulator calls it from its event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from wavepp.cache.results import CommitResult
from wavepp.cache.snapshot_plan import snapshot_boundaries
from wavepp.cache.store_tier import StoreTier
from wavepp.sched.messages import (
    Chunk,
    Hint,
    ItemResult,
    LeaseItem,
    LeaseMsg,
    LeaseReply,
    ProbeItem,
    ProbeMsg,
    ProbeReply,
    ReleaseMsg,
    Wave,
)

if TYPE_CHECKING:
    from wavepp.cache import BlockPool, HostTier, SnapshotPool


class PlanMismatchError(RuntimeError):
    """The leader's plan disagrees with this stage's own state."""


@dataclass
class StageRequest:
    """This stage's copy of an admitted request."""

    request_id: int
    num_tokens: int
    block_hashes: tuple[int, ...]
    num_cached_tokens: int
    num_computed_tokens: int
    block_table: list[int] | None = None  # None until the first chunk reaches this stage
    num_loaded_blocks: int = 0  # of the cached prefix, loaded from the host tier or the store


@dataclass(frozen=True)
class StageCounters:
    """A stage's cache counters since start (`StageServer.counters`), in blocks unless named:
    what its probes found here; what admitted requests reused (held on every stage), of which
    loaded from the host tier and from the shared store; what its pool evicted; the host
    tier's bytes held and blocks copied in; the blocks it handed the store and the loads the
    store refused (a block gone or bad); and the store backend's own (`store`: name, value)."""

    probe_hit_blocks: int = 0
    reused_blocks: int = 0
    evicted_blocks: int = 0
    host_loaded_blocks: int = 0
    store_loaded_blocks: int = 0
    host_held_bytes: int = 0
    host_offloaded_blocks: int = 0
    store_published_blocks: int = 0
    store_refused_loads: int = 0
    block_bytes: int = 0  # one block of this stage's layers (0: no tier sized it)
    store_namespace: str = ""  # its keys' prefix in the shared store ("": no store)
    store: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class PreparedChunk:
    """A chunk ready to run here. Hybrid models: the state slot to start from (None: zeros)
    and the (position, slot) pairs to save, as `models.ChunkSpec` takes them."""

    chunk: Chunk
    block_table: list[int]
    state_in: int | None = None
    state_saves: tuple[tuple[int, int], ...] = ()


class StageServer:
    def __init__(self, stage_id: int, pool: "BlockPool", store_tier: StoreTier | None = None):
        """A hybrid (recurrent-state) model's stage has a `SnapshotPool`: it resumes a request
        only at a block boundary where it holds a snapshot, pending or computed. `store_tier`:
        the KV store every replica shares, below the pool's host tier (None: none)."""
        self.stage_id = stage_id
        self.pool = pool
        self.store_tier = store_tier
        self.block_size = pool.block_size
        self.requests: dict[int, StageRequest] = {}
        self._probed: dict[int, ProbeItem] = {}
        self._store_runs: dict[int, tuple[int, int]] = {}  # probed: the store's run of blocks
        # the same pool, seen as a SnapshotPool, when it keeps snapshots (a hybrid model's)
        self._snapshots = cast("SnapshotPool", pool) if pool.keeps_snapshots else None
        self.num_probe_hit_blocks = 0  # counters since start (metrics): counters()
        self.num_reused_blocks = 0
        self.num_host_loaded_blocks = 0  # of the reused: loaded from the host tier

    def handle(self, msg, prefetched: dict | None = None):
        """Answer one rounds-plane message; ReleaseMsg has no reply. `prefetched`: a lease's
        store bytes, taken before (`prefetch`)."""
        if isinstance(msg, ProbeMsg):
            return self.probe(msg, prefetched)
        if isinstance(msg, LeaseMsg):
            return self.lease(msg, prefetched)
        if isinstance(msg, ReleaseMsg):
            return self.release(msg)
        raise TypeError(f"stage {self.stage_id}: unknown rounds-plane message {type(msg).__name__}")

    # ---- admission -------------------------------------------------------------------------

    def probe(self, msg: ProbeMsg, store_held: dict | None = None) -> ProbeReply:
        """Local reuse candidate of each request: the longest prefix present here. Mutates nothing
        but remembers the hashes for the lease that may follow. `store_held`: which blocks of
        each prompt the shared store holds, asked before (`prefetch`)."""
        for item in msg.items:
            self._probed[item.request_id] = item
        hints = self.query(msg.items, store_held)
        for hint in hints:  # the store's run, [start, end) in blocks, for prefetch
            if hint.num_store_blocks:
                self._store_runs[hint.request_id] = (
                    hint.num_blocks - hint.num_store_blocks,
                    hint.num_blocks,
                )
        self.num_probe_hit_blocks += sum(h.num_blocks for h in hints)
        return ProbeReply(msg.round_id, self.stage_id, hints)

    def counters(self) -> StageCounters:
        """This stage's cache counters since start (see `StageCounters`)."""
        host, store = self.pool.host_tier, self.store_tier
        backend = getattr(store.store, "counters", None) if store is not None else None
        return StageCounters(
            self.num_probe_hit_blocks,
            self.num_reused_blocks,
            getattr(self.pool, "num_evicted_blocks", 0),
            self.num_host_loaded_blocks,
            store.num_loaded_blocks if store is not None else 0,
            host.used_bytes if host is not None else 0,
            host.num_offloaded if host is not None else 0,
            store.num_published_blocks if store is not None else 0,
            store.num_refused_loads if store is not None else 0,
            store.block_bytes if store is not None else host.block_bytes if host is not None else 0,
            store.namespace if store is not None else "",
            tuple(backend().items()) if backend is not None else (),
        )

    def query(self, items, store_held: dict | None = None) -> tuple[Hint, ...]:
        """Each item's hint, as a probe gives it, with nothing remembered: what a router asks
        (how much of a prompt this stage holds) between rounds. `store_held`: as probe's
        (None: the store is asked here)."""
        hints = []
        for item in items:
            match = self.pool.match(item.block_hashes)
            num_blocks = match.num_blocks
            # the host tier's run of blocks after a GPU prefix that is all computed here
            num_host = self._host_blocks(item.block_hashes, match)
            if self._snapshots is not None:
                hints.append(self._hybrid_hint(item, match, num_host))
                continue
            num_store = self._store_blocks(
                item.block_hashes,
                match,
                num_blocks + num_host,
                (store_held or {}).get(item.request_id),
            )
            hints.append(
                Hint(
                    item.request_id,
                    num_blocks + num_host + num_store,
                    num_host_blocks=num_host,
                    num_store_blocks=num_store,
                )
            )
        return tuple(hints)

    def prefetch(self, msg) -> dict | None:
        """What a round message needs of the shared store, asked without the stage's lock (the
        caller holds none: the store is across a network, and the compute loop needs that
        lock). For a probe, which blocks of each prompt the store holds ({request id: [bool]});
        for a lease, the bytes of each item whose agreed prefix runs into the run of blocks its
        probe found in the store ({request id: (start, end, bytes)}), read from what the probe
        remembered (the same thread answers probes and leases); the lease uses them only if its
        own range is the same."""
        store = self.store_tier
        if store is None or self._snapshots is not None:
            return None
        if isinstance(msg, ProbeMsg):  # which of each prompt's blocks the store holds
            return {item.request_id: store.held(item.block_hashes) for item in msg.items}
        if not isinstance(msg, LeaseMsg):
            return None
        fetched = {}
        for item in msg.items:
            probed = self._probed.get(item.request_id)
            run = self._store_runs.get(item.request_id)
            if probed is None or run is None or item.num_leased_blocks <= run[0]:
                continue
            start, end = run[0], min(run[1], item.num_leased_blocks)
            fetched[item.request_id] = (start, end, store.prefetch(probed.block_hashes[start:end]))
        return fetched

    def lease(self, msg: LeaseMsg, prefetched: dict | None = None) -> LeaseReply:
        """Lease the agreed prefix, escrow room for the rest and commit the escrow: the
        request's own full blocks become pending entries that later requests can share while
        they are computed. On failure hold nothing. Items are handled in order, so a later
        item's lease that takes a victim of an earlier one's (committed) escrow must leave a
        replacement or is refused: the earlier request keeps its room."""
        results = []
        for item in msg.items:
            probed = self._probed.pop(item.request_id, None)
            if probed is None:
                results.append(
                    ItemResult(item.request_id, False, f"stage {self.stage_id}: lease before probe")
                )
                continue
            if (
                self.pool.host_tier is not None or self.store_tier is not None
            ) and item.num_leased_blocks > self.pool.match(probed.block_hashes).num_blocks:
                result = self._lease_from_tiers(
                    item, probed, (prefetched or {}).get(item.request_id)
                )
                self.num_reused_blocks += item.num_leased_blocks if result.ok else 0
                results.append(result)
                continue
            lease = self.pool.lease(item.request_id, probed.block_hashes, item.num_leased_blocks)
            if not lease.ok:
                self._drop(item.request_id)
                results.append(
                    ItemResult(
                        item.request_id, False, f"stage {self.stage_id}: lease: {lease.reason}"
                    )
                )
                continue
            reserve = self.pool.reserve(item.request_id, item.num_new_blocks)
            snapshots = self._snapshots
            if reserve.ok and snapshots is not None:
                boundaries = snapshot_boundaries(
                    item.num_leased_blocks,
                    probed.num_tokens,
                    self.block_size,
                    snapshots.interval_blocks,
                )
                reserve = snapshots.reserve_snapshots(item.request_id, boundaries)
            if not reserve.ok:
                self._drop(item.request_id)
                results.append(
                    ItemResult(
                        item.request_id, False, f"stage {self.stage_id}: escrow: {reserve.reason}"
                    )
                )
                continue
            commit = self.pool.commit(
                item.request_id, probed.block_hashes[item.num_leased_blocks :]
            )
            if not commit.ok:  # (cannot happen: nothing ran since the reserve; kept as a check)
                self._drop(item.request_id)
                results.append(
                    ItemResult(
                        item.request_id, False, f"stage {self.stage_id}: commit: {commit.reason}"
                    )
                )
                continue
            num_cached = item.num_leased_blocks * self.block_size
            self.num_reused_blocks += item.num_leased_blocks
            self.requests[item.request_id] = StageRequest(
                item.request_id, probed.num_tokens, probed.block_hashes, num_cached, num_cached
            )
            results.append(ItemResult(item.request_id, True))
        # one round at a time: a request probed but not in this lease (aborted, deferred) is
        # probed again if it comes back
        self._probed.clear()
        self._store_runs.clear()
        return LeaseReply(msg.round_id, self.stage_id, tuple(results), self.pool.capacity())

    def _lease_from_tiers(
        self, item: LeaseItem, probed: ProbeItem, prefetched: tuple | None = None
    ) -> ItemResult:
        """The agreed prefix runs past the blocks this stage's GPU pool holds: lease the GPU
        part, load the rest from the host tier, then the store, into new blocks now, escrow
        room for the prompt after it. On failure hold nothing.

            [0, resume)          leased (hybrid: the last snapshot boundary <= on_gpu, where it
                                 resumes; else on_gpu)
            [resume, on_gpu)     on the GPU beyond that boundary: pinned (borrowed) at commit
            [on_gpu, stored)     loaded from the host tier; with the states of the boundaries
                                 in (resume, agreed]
            [stored, agreed)     fetched from the shared store (models without states)
            [agreed, ...)        computed by the request's chunks

        The loaded blocks are published at once (their KV is there before any wave reads
        them), so the request's own round is the last to see them pending. Their bytes are
        copied here, on the thread answering the round: the store's are fetched (and checked)
        first, before anything is held; the host tier's are copied out before materialize;
        both are written into the new blocks after it."""
        pool, block_size, hashes = self.pool, self.block_size, probed.block_hashes
        snapshots, host = self._snapshots, pool.host_tier
        agreed, request_id = item.num_leased_blocks, item.request_id
        match = pool.match(hashes)
        on_gpu = match.num_blocks
        stored = on_gpu + min(self._host_blocks(hashes, match), agreed - on_gpu)
        fetched, reason = None, ""
        if match.num_computed_blocks < on_gpu or (stored < agreed and self.store_tier is None):
            reason = f"blocks [{on_gpu}, {agreed}) are no longer in the host tier"
        elif stored < agreed:
            store = cast(StoreTier, self.store_tier)
            if prefetched is not None and prefetched[:2] == (stored, agreed):
                fetched = store.fetch(hashes[stored:agreed], prefetched[2])
            else:  # the pool or the host tier changed since the probe: fetch it now
                fetched = store.fetch(hashes[stored:agreed])
            reason = f"blocks [{stored}, {agreed}) left the store or failed its checksum"
        if stored < agreed and fetched is None:
            return ItemResult(request_id, False, f"stage {self.stage_id}: {reason}")
        resume, boundaries, num_states = self._resume_plan(hashes, on_gpu, agreed, probed)
        lease = pool.lease(request_id, hashes, resume)
        reserve = (
            pool.reserve(request_id, agreed - resume + item.num_new_blocks) if lease.ok else lease
        )
        if reserve.ok and snapshots is not None:
            reserve = snapshots.reserve_snapshots(request_id, boundaries)
        commit = pool.commit(request_id, hashes[resume:]) if reserve.ok else reserve
        states = self._state_loads(request_id, hashes, agreed) if commit.ok else ((), ())
        if commit.ok and (
            (stored > on_gpu and cast("HostTier", host).match(hashes, on_gpu) < stored - on_gpu)
            or states is None
        ):
            # the states reserve evicted alone went to the tier, and it dropped some of these
            commit = CommitResult(
                False, reason=f"blocks [{on_gpu}, {stored}) left the host tier while room was made"
            )
        if not commit.ok or states is None:
            self._drop(request_id)
            return ItemResult(
                request_id, False, f"stage {self.stage_id}: tier load: {commit.reason}"
            )
        block_table = self._land(
            request_id, hashes, (resume, on_gpu, stored, agreed), (num_states, *states), fetched
        )
        num_cached = agreed * block_size
        pool.publish(request_id, num_cached)
        self.requests[request_id] = StageRequest(
            request_id,
            probed.num_tokens,
            hashes,
            num_cached,
            num_cached,
            block_table,
            num_loaded_blocks=agreed - on_gpu,
        )
        return ItemResult(request_id, True)

    def _hybrid_hint(self, item: ProbeItem, match, num_host: int) -> Hint:
        """A hybrid model's hint: the pool's snapshots (O(log n): the grid snapshots of a chain,
        pending ones too, form a prefix of the grid) and the boundaries after the pool's
        prefix where a load could resume: blocks held by the host tier, then the store, and
        the state there in either (`_loadable_points`)."""
        snapshots = cast("SnapshotPool", self._snapshots)
        hashes, num_blocks = item.block_hashes, match.num_blocks
        last_reusable = (item.num_tokens - 1) // self.block_size
        found = snapshots.match_snapshots(hashes, min(num_blocks, last_reusable))
        resume, start = found.num_blocks, num_blocks + num_host
        num_store, store_states = 0, []
        if self.store_tier is not None and start < last_reusable:
            num_store = self._store_blocks(hashes, match, start)
            if num_store:  # the states of every boundary a load may cover, from `resume`
                store_states = self.store_tier.states_held(hashes[resume : start + num_store])
        host = self.pool.host_tier

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
        snapshots, host, store = self._snapshots, self.pool.host_tier, self.store_tier
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
        host, store = self.pool.host_tier, self.store_tier
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

    def _host_blocks(self, block_hashes, match) -> int:
        """Blocks the host tier holds right after the GPU prefix of `match`; 0 without a tier
        or when that prefix is not all computed here (a load lands after a computed block)."""
        host = self.pool.host_tier
        if host is None or match.num_computed_blocks < match.num_blocks:
            return 0
        return host.match(block_hashes, match.num_blocks)

    def _store_blocks(self, block_hashes, match, start: int, held=None) -> int:
        """Blocks the shared store holds from `start` (after the pool's and the host tier's);
        0 without a store or when the GPU prefix is not all computed here."""
        store = self.store_tier
        if store is None or match.num_computed_blocks < match.num_blocks:
            return 0
        return store.match(block_hashes, start, held)

    def take_host_bytes(self) -> int:
        """Bytes this stage moved over its host link (loads and offloads) since the last call:
        the next wave here waits for them."""
        host = self.pool.host_tier
        return 0 if host is None else host.take_transferred_bytes()

    def release(self, msg: ReleaseMsg) -> None:
        """Give back everything the requests hold here. Unknown ids are ignored: a stage that
        failed a request already let it go."""
        for request_id in msg.request_ids:
            self._drop(request_id)

    # ---- execution -------------------------------------------------------------------------

    def prepare(self, wave: Wave) -> list[PreparedChunk]:
        """Materialize each request's blocks when its first chunk reaches this stage, and check
        the leader's (request, start, end) against local state."""
        prepared = []
        for chunk in wave.chunks:
            req = self.requests.get(chunk.request_id)
            if req is None:
                raise PlanMismatchError(
                    f"stage {self.stage_id}: wave {wave.wave_id} has chunk {chunk} of request "
                    f"{chunk.request_id}, which this stage has not admitted"
                )
            if (
                chunk.start != req.num_computed_tokens
                or not (chunk.start < chunk.end <= req.num_tokens)
                or chunk.is_last != (chunk.end == req.num_tokens)
            ):
                raise PlanMismatchError(
                    f"stage {self.stage_id}: wave {wave.wave_id}: leader planned tokens "
                    f"[{chunk.start}, {chunk.end}) (last={chunk.is_last}) of request {chunk.request_id}; "
                    f"this stage has computed [0, {req.num_computed_tokens}) of {req.num_tokens}"
                )
            if req.block_table is None:
                req.block_table = self.pool.materialize(chunk.request_id)
                num_leased = req.num_cached_tokens // self.block_size
                if num_leased:
                    computed = self.pool.match(req.block_hashes[:num_leased]).num_computed_blocks
                    if computed < num_leased:
                        raise PlanMismatchError(
                            f"stage {self.stage_id}: wave {wave.wave_id}: request {chunk.request_id} "
                            f"reuses {num_leased} blocks but only {computed} are computed here "
                            f"(the leader dispatched it before the request computing them)"
                        )
                if self._snapshots is not None:
                    leased = self._snapshots.snapshot_plan(chunk.request_id).leased
                    if leased is not None and not leased.computed:
                        raise PlanMismatchError(
                            f"stage {self.stage_id}: wave {wave.wave_id}: request {chunk.request_id} "
                            f"resumes from the state after block {num_leased - 1}, which request "
                            f"{leased.owner_id} has not written here yet"
                        )
            prepared.append(
                self._with_states(chunk, req, self._snapshots)
                if self._snapshots is not None
                else PreparedChunk(chunk, req.block_table)
            )
        return prepared

    def _with_states(
        self, chunk: Chunk, req: StageRequest, snapshots: SnapshotPool
    ) -> PreparedChunk:
        """Which state slot the chunk starts from and which it saves into. Between chunks a
        request carries its state in its working slot (a boundary's slot may go back to the
        pool at publish, if that boundary has a snapshot already):

            start ... planned boundaries in (start, end] ... end (-> working slot, unless last)
        """
        plan = snapshots.snapshot_plan(chunk.request_id)
        if chunk.start == req.num_cached_tokens and req.num_loaded_blocks:
            state_in = plan.working_slot  # the lease loaded the state it resumes from there
        elif chunk.start == req.num_cached_tokens:
            state_in = plan.leased.slot if plan.leased is not None else None
        else:
            state_in = plan.working_slot
        saves = [
            (b * self.block_size, slot)
            for b, slot in sorted(plan.save_slots().items())
            if chunk.start < b * self.block_size <= chunk.end
        ]
        if not chunk.is_last:  # a request that goes on holds a working slot
            saves.append((chunk.end, cast(int, plan.working_slot)))
        block_table = cast("list[int]", req.block_table)  # prepare() materialized it
        return PreparedChunk(chunk, block_table, state_in, tuple(saves))

    def complete(self, wave: Wave) -> None:
        """The wave ran here: publish the computed blocks; free requests that are done and the
        ones the leader released in this wave. With a shared store, the full blocks each chunk
        finished go to it first (their bytes copied now, before anything can reuse them)."""
        if self.store_tier is not None:
            self._publish_to_store(wave)
        for chunk in wave.chunks:
            req = self.requests[chunk.request_id]
            req.num_computed_tokens = chunk.end
            self.pool.publish(chunk.request_id, chunk.end)
            if chunk.is_last:
                self.pool.free(chunk.request_id)
                del self.requests[chunk.request_id]
        for request_id in wave.release_ids:
            self._drop(request_id)

    def _publish_to_store(self, wave: Wave) -> None:
        """Hand the store every full block a chunk of `wave` finished here (blocks b with
        start < (b + 1) * block_size <= end) and, on a hybrid model, every state it saved at
        a block boundary."""
        hashes: list[int] = []
        block_ids: list[int] = []
        state_hashes: list[int] = []
        slots: list[int] = []
        for chunk in wave.chunks:
            req = self.requests[chunk.request_id]
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
        store = cast(StoreTier, self.store_tier)
        store.publish(hashes, block_ids)
        store.publish_states(state_hashes, slots)

    def _drop(self, request_id: int) -> None:
        self._probed.pop(request_id, None)
        self._store_runs.pop(request_id, None)
        self.requests.pop(request_id, None)
        if self.pool.has_request(request_id):
            self.pool.release(request_id)
