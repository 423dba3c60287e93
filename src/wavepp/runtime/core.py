"""Rank 0: the leader and stage 0, in three threads (its CoreLoops, core_loops.py).

    WAVE     admission rounds with every stage, beside execution (asynchronous policies)
    LOOP     plans the next wave and runs stage 0 on it; under lockstep it first runs a
             whole admission round whenever requests wait (the mechanism lockstep tests);
             under trtllm-pp and sglang-pp it runs those frameworks' iterations instead
             (outside_loop.py)
    RESULTS  receives first tokens from the last stage and completes requests, and the stages'
             KV export reports, handed to the KV hand-off (kv_transfer/handoff.py: a request
             that exports ends at its last report, or at its deadline, on the hand-off's thread)

Leader state is shared under one lock (`cond`); the stage's pool has its own lock
(StageRuntime). Every change a waiting thread may care about notifies `cond`.

Callers (the Engine, the server through it) use the public methods below; an outside loop
uses the loops' LoopHost part (loop_host.py). The caller's request ids: live_requests.py.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Callable

from wavepp.cache import CapacityView
from wavepp.kv_events.feed import KVEventsFeed
from wavepp.kv_transfer.handoff import KVHandoff
from wavepp.runtime.cache_queries import CachedView, CacheQueries
from wavepp.runtime.channels import Channels, PeerLostError, Shutdown
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.core_loops import CoreLoops
from wavepp.runtime.core_stats import CoreStats, EngineLoad
from wavepp.runtime.live_requests import LiveRequests
from wavepp.runtime.profile import WaveProfile, profile_pipeline
from wavepp.runtime.protocol import (
    CheckIntegrity,
    EngineError,
    ExportReport,
    IntegrityReport,
    Reset,
)
from wavepp.runtime.rounds_plane import RoundsPlane, start_stages
from wavepp.runtime.runtime_leader import build_runtime_leader
from wavepp.sched import get_policy


class EngineCore:
    def __init__(
        self,
        config: RuntimeConfig,
        channels: Channels,
        check_alive: Callable[[float], str | None] = lambda wait_s: None,
        handoff: KVHandoff | None = None,
        kv_events_publisher=None,
    ):
        """Load stage 0 here and wait for every other stage to load. Threads start in start().
        `handoff`: the KV hand-off (with a store) the stages' export reports go to.
        `kv_events_publisher`: where the KV cache events of the blocks every stage holds go (an
        EventPublisher, opened by the caller; kv_events/); None: no events."""
        self.config = config
        self.channels = channels
        self.num_stages = config.engine.pp
        self._check_alive = check_alive
        self.stage, self.stage_num_blocks, self._worker_kernels = start_stages(config, channels)
        self._plane = RoundsPlane(channels, self.stage, self.num_stages)
        self._kv_events: KVEventsFeed | None = None
        if kv_events_publisher is not None:
            self._kv_events = KVEventsFeed(
                self.num_stages,
                config.engine.block_size,
                kv_events_publisher,
                hybrid=self.stage.layout.is_hybrid,
            )
        self._queries = CacheQueries(
            channels,
            self.stage,
            self.num_stages,
            config.engine.block_size,
            hybrid=self.stage.layout.is_hybrid,
            block_changes=self._kv_events,
        )
        self.max_prompt_tokens = self.stage.model_config.max_position_embeddings
        self.vocab_size = self.stage.model_config.vocab_size
        self.profile: WaveProfile | None = None
        if config.engine.profile_waves:
            self.profile = profile_pipeline(
                self.stage, channels, self.stage_num_blocks, self.max_prompt_tokens
            )
        self.cond = threading.Condition(threading.RLock())
        self.error: str | None = None
        self._t0 = time.perf_counter()
        self._t0_unix = time.time()  # the same instant on the wall clock (unix_at)
        self._requests = LiveRequests()
        self._handoff = handoff
        self._on_done: Callable = lambda request_id, req, export_errors: (request_id, req)
        if self.stage.exporter is not None:  # stage 0's parts are reported here, on its writer
            self.stage.exporter.on_outcome = lambda outcome: self.on_export_report(
                ExportReport((outcome,))
            )
        self.snapshot_align_frac = config.engine.snapshot_align_frac
        self._build_leader(config.engine.policy)
        self._loops = CoreLoops(
            self.stage,
            channels,
            self._plane,
            self.cond,
            self.leader,
            self.policy,
            now=self.now,
            deliver=self._deliver,
            on_export_report=self.on_export_report,
            on_crash=self._crashed,
        )

    def start(self, on_done: Callable) -> None:
        """Start the threads; `on_done(request_id, request, export_errors)` gives each future
        its value (export_errors: {stage: why} of the request's KV parts that failed)."""
        self._on_done = on_done
        self._loops.start()
        if self._kv_events is not None:
            self._kv_events.start(self._queries.poll)

    @property
    def compute_thread_ids(self) -> tuple[int, ...]:
        """The native ids of rank 0's threads that run stage 0's forward."""
        return self._loops.compute_thread_ids

    # ---- API (any thread) --------------------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def unix_at(self, t: float) -> float:
        """The wall-clock (unix) time of `now()`'s `t`, as the wave spans are recorded."""
        return self._t0_unix + t

    def submit(
        self,
        request_id: int | None,
        token_ids,
        *,
        logprob_start: int | None = None,
        export_id: str | None = None,
        priority: int = 0,
    ) -> Future:
        """Queue a request under the caller's id (None: the next free automatic id), with its
        options: the request is created with them, so no round sees it without them.
        `logprob_start`, `export_id`, `priority`: see Leader.add_request. An id in use by an
        unfinished request, or an option the prompt cannot take, is refused with ValueError,
        and nothing is queued."""
        with self.cond:
            self._raise_if_closed()
            internal_id, fut = self._requests.add(request_id)
            try:
                self.leader.add_request(
                    internal_id,
                    token_ids,
                    self.now(),
                    logprob_start=logprob_start,
                    export_id=export_id,
                    priority=priority,
                )
            except ValueError:
                self._requests.pop(internal_id)
                raise
            if self._kv_events is not None:  # the events carry its blocks' tokens
                self._kv_events.note_prompt(self.leader.requests[internal_id])
            if export_id is not None:
                self._handoff.expect(internal_id)
            self._deliver()
            self.cond.notify_all()
        return fut

    def abort(self, request_id: int) -> None:
        """Abort the caller's request at any step; an unknown or finished id is ignored."""
        with self.cond:
            internal_id = self._requests.internal_id(request_id)
            if internal_id is None:
                return
            self.leader.abort(internal_id, self.now())
            self._deliver()
            self.cond.notify_all()

    def load(self) -> EngineLoad:
        """Waiting and running counts, and the engine's fatal error if any, read under cond."""
        with self.cond:
            leader = self.leader
            num_round = len(leader.round.requests) if leader.round is not None else 0
            return EngineLoad(len(leader.waiting) + num_round, len(leader.plannable), self.error)

    def stage_capacity(self) -> list[CapacityView | None]:
        """Each stage's blocks by state: stage 0's now, the others' as their last admission
        commit reported them (None before their first)."""
        with self.cond:
            out = list(self.leader.stage_capacity)
        out[0] = self.stage.capacity()
        return out

    def leader_state_size(self) -> int:
        """Entries of the leader's per-request structures (Leader.state_size): bounded by the
        requests outstanding, 0 once the pipeline drained."""
        with self.cond:
            return self.leader.state_size()

    def reset(
        self,
        policy: str | None = None,
        snapshot_interval_blocks: int | None = None,
        snapshot_align_frac: float | None = None,
    ) -> None:
        """Empty every stage's cache and (optionally) switch policy and, for a hybrid model, the
        snapshot grid: every stage takes the same one, so the leader's agreed boundaries stay
        ones every stage can hold. Waits for idle."""
        policy = policy or self.policy.name
        get_policy(policy, runtime=True)
        if snapshot_interval_blocks is not None and snapshot_interval_blocks < 1:
            raise ValueError(
                f"snapshot_interval_blocks must be >= 1, got {snapshot_interval_blocks}"
            )
        if snapshot_align_frac is not None and not 0 <= snapshot_align_frac < 1:
            raise ValueError(f"snapshot_align_frac must be in [0, 1), got {snapshot_align_frac}")
        with self.cond:
            self._wait_idle()
            with self._queries.held():  # no cache query spans the reset
                self.stage.reset(policy, snapshot_interval_blocks)
                if snapshot_align_frac is not None:
                    self.snapshot_align_frac = snapshot_align_frac
                self._build_leader(policy)
                self._loops.reset(self.leader, self.policy)
                self._plane.ask_workers(Reset(policy, snapshot_interval_blocks))
                if self._kv_events is not None:  # AllBlocksCleared
                    self._kv_events.clear()

    def check_integrity(self) -> list[IntegrityReport]:
        """Every stage's check_integrity() and capacity, once the pipeline is idle."""
        with self.cond:
            self._wait_idle()
            out = [self.stage.check_integrity()]
            return out + [reply.detail for reply in self._plane.ask_workers(CheckIntegrity())]

    def stage_kernels(self) -> tuple[str, ...]:
        """Each stage's kernel paths: rank 0's as its process runs them now, the other ranks' as
        they reported at start-up (each its own process)."""
        return (self.stage.kernels(),) + self._worker_kernels[1:]

    def stats(self, rounds_since: int | None = None) -> CoreStats:
        """A consistent snapshot of the measurements since the last reset (CoreStats.snapshot)."""
        with self.cond:
            return self._loops.stats.snapshot(rounds_since)

    def cached_prefix(self, token_lists) -> list[CachedView]:
        """How much of each prompt every stage holds now (runtime/cache_queries.py); off the
        core's lock, beside rounds and waves."""
        return self._queries.ask(token_lists)

    def stage_cache_counters(self) -> list:
        """Every stage's cache counters now (StageCacheCounters), asked of every stage."""
        return self._queries.stage_counters()

    def kv_events_counts(self) -> dict[str, int] | None:
        """The KV cache events' publisher counters (None: no events)."""
        return None if self._kv_events is None else self._kv_events.counts()

    @property
    def kv_writer(self):
        """Stage 0's KV writer (a StageWriter, in this process), or None without a hand-off:
        rank 0's hand-off releases parts and reads the stages' arenas through its transfer
        engine."""
        exporter = self.stage.exporter
        return None if exporter is None else exporter.writer

    @property
    def num_live_requests(self) -> int:
        with self.cond:
            return len(self._requests)

    def shutdown(self) -> None:
        """Stop every thread and stage; requests not finished by then fail with EngineError.
        The order: WAVE and LOOP (nothing new reaches the stages), then the KV events' FEED
        thread and publisher (its queries end before the stages do), then the stages are told
        (rounds plane, then the headers plane, whose shutdown comes back on the results plane),
        then RESULTS, then stage 0's own writer and pool."""
        with self.cond:
            if self._loops.stopping and not self._loops.alive:
                self._fail_all("the engine was shut down before the request finished")
                if self._kv_events is not None:  # (closing twice is harmless)
                    self._kv_events.close()
                return
            self._loops.stop()
        self._loops.join_drivers(timeout=10)
        if self._kv_events is not None:  # its thread's queries end before the stages do
            self._kv_events.close()
        if self.num_stages > 1 and not self.error:
            self._queries.close()
            try:
                self._plane.tell_workers(Shutdown())
                self.channels.send_obj(Shutdown(), 1, "headers")
            except PeerLostError:
                pass
        self._loops.join_results(timeout=10)
        self.stage.close()
        with self.cond:
            self._fail_all(self.error or "the engine was shut down before the request finished")

    # ---- the KV hand-off's wiring (kv_transfer/handoff.py) ------------------------------------

    def on_export_report(self, report: ExportReport) -> None:
        """Stages' KV export outcomes, to the hand-off; a request they complete ends."""
        with self.cond:
            for outcome in report.outcomes:
                completed = self._handoff.report(outcome)
                if completed is not None:
                    self._resolve(*completed)

    def answer_overdue(self, req, errors: dict[int, str]) -> None:
        """The hand-off's deadline passed for a finished request: it ends, with `errors`."""
        with self.cond:
            self._resolve(req, errors)

    # ---- helpers -----------------------------------------------------------------------------

    def _deliver(self) -> None:
        """Under cond: resolve the future of every request the leader finished (one that exports
        its KV: once every stage reported its part, kv_transfer/handoff.py)."""
        for req in self.leader.take_finished():
            if self._kv_events is not None:
                self._kv_events.end_prompt(req)
            if self._handoff is None:
                self._resolve(req, {})
            elif not self._handoff.finished(req):
                self._resolve(req, self._handoff.take_errors(req.request_id))

    def _resolve(self, req, errors: dict[int, str]) -> None:
        """Under cond: the request ended; its future gets on_done(caller's id, req, errors)."""
        self._requests.resolve(
            req.request_id, lambda request_id: self._on_done(request_id, req, errors)
        )

    def _build_leader(self, policy: str) -> None:
        self.policy = get_policy(policy, runtime=True)
        self.leader = build_runtime_leader(
            self.policy,
            num_stages=self.num_stages,
            block_size=self.config.engine.block_size,
            stage_num_blocks=self.stage_num_blocks,
            max_prompt_tokens=self.max_prompt_tokens,
            hybrid=self.stage.layout.is_hybrid,
            snapshot_interval_blocks=self.stage.snapshot_interval_blocks,
            snapshot_align_frac=self.snapshot_align_frac,
            profile=self.profile,
            scheduling_policy=self.config.engine.scheduling_policy,
            priority_aging_s=self.config.engine.priority_aging_s,
        )

    def _wait_idle(self) -> None:
        """Under cond: until nothing is waiting, planned or in flight (or the engine stopped)."""
        self._raise_if_closed()
        while not self.leader.idle and not self._loops.stopping:
            self.cond.wait()
        self._raise_if_closed()

    def _raise_if_closed(self) -> None:
        if self.error:
            raise EngineError(self.error)
        if self._loops.stopping:
            raise EngineError("the engine is shut down")

    def _fail_all(self, reason: str) -> None:
        """Under cond: every unfinished request's future fails with EngineError(reason)."""
        self._requests.fail_all(EngineError(reason))

    def fail(self, reason: str) -> None:
        """Fatal: record the first reason, fail every unfinished request with it, stop."""
        with self.cond:
            if self.error is None:
                self.error = reason
            self._loops.stop()
            self._fail_all(self.error)

    def _crashed(self, exc: Exception) -> None:
        """A thread of the loops raised (called on it, as it ends): the engine fails, named."""
        if isinstance(exc, PeerLostError):
            # a lost peer is most often a dead stage: name it (waiting briefly for its exit)
            self.fail(self._check_alive(1.0) or str(exc))
        else:  # a bug or a rejected plan: stop loudly
            self.fail(f"rank 0 ({threading.current_thread().name}): {type(exc).__name__}: {exc}")
