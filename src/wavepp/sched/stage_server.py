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
from wavepp.sched.stage_tiers import StageTiers

if TYPE_CHECKING:
    from wavepp.cache import BlockPool, SnapshotPool


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
        the KV store every replica shares, below the pool's host tier (None: none); both
        tiers are `tiers`' (sched/stage_tiers.py)."""
        self.stage_id = stage_id
        self.pool = pool
        self.tiers = StageTiers(stage_id, pool, store_tier)
        self.block_size = pool.block_size
        self.requests: dict[int, StageRequest] = {}
        self._probed: dict[int, ProbeItem] = {}
        # the same pool, seen as a SnapshotPool, when it keeps snapshots (a hybrid model's)
        self._snapshots = cast("SnapshotPool", pool) if pool.keeps_snapshots else None
        self.num_probe_hit_blocks = 0  # counters since start (metrics): counters()
        self.num_reused_blocks = 0

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
        self.tiers.remember_runs(hints)  # for the prefetch of the lease that may follow
        self.num_probe_hit_blocks += sum(h.num_blocks for h in hints)
        return ProbeReply(msg.round_id, self.stage_id, hints)

    def counters(self) -> StageCounters:
        """This stage's cache counters since start (see `StageCounters`)."""
        host, store = self.tiers.host, self.tiers.store
        backend = getattr(store.store, "counters", None) if store is not None else None
        return StageCounters(
            self.num_probe_hit_blocks,
            self.num_reused_blocks,
            getattr(self.pool, "num_evicted_blocks", 0),
            self.tiers.num_host_loaded_blocks,
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
            if self._snapshots is not None:
                hints.append(self.tiers.hybrid_hint(item, match))
                continue
            # the tiers' runs of blocks after a GPU prefix that is all computed here
            num_host, num_store = self.tiers.held_after(
                item, match, (store_held or {}).get(item.request_id)
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
        """What a round message needs of the shared store, asked without the stage's lock
        (`StageTiers.prefetch`); None without a store."""
        return self.tiers.prefetch(msg, self._probed)

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
                self.tiers.any
                and item.num_leased_blocks > self.pool.match(probed.block_hashes).num_blocks
            ):
                results.append(self._lease_from_tiers(item, probed, prefetched))
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
        self.tiers.forget()
        return LeaseReply(msg.round_id, self.stage_id, tuple(results), self.pool.capacity())

    def _lease_from_tiers(
        self, item: LeaseItem, probed: ProbeItem, prefetched: dict | None
    ) -> ItemResult:
        """The agreed prefix runs past this stage's pool: the tiers load it (`StageTiers.lease`)
        and the request is admitted here with its blocks."""
        loaded = self.tiers.lease(item, probed, (prefetched or {}).get(item.request_id))
        if isinstance(loaded, ItemResult):
            return loaded
        num_cached = item.num_leased_blocks * self.block_size
        self.num_reused_blocks += item.num_leased_blocks
        self.requests[item.request_id] = StageRequest(
            item.request_id,
            probed.num_tokens,
            probed.block_hashes,
            num_cached,
            num_cached,
            loaded.block_table,
            num_loaded_blocks=loaded.num_loaded_blocks,
        )
        return ItemResult(item.request_id, True)

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
        self.tiers.publish(wave, self.requests)
        for chunk in wave.chunks:
            req = self.requests[chunk.request_id]
            req.num_computed_tokens = chunk.end
            self.pool.publish(chunk.request_id, chunk.end)
            if chunk.is_last:
                self.pool.free(chunk.request_id)
                del self.requests[chunk.request_id]
        for request_id in wave.release_ids:
            self._drop(request_id)

    def _drop(self, request_id: int) -> None:
        self._probed.pop(request_id, None)
        self.tiers.forget(request_id)
        self.requests.pop(request_id, None)
        if self.pool.has_request(request_id):
            self.pool.release(request_id)
