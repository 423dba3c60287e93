"""Rank 0: the leader and stage 0, in three threads (four with a KV store).

    WAVE     admission rounds with every stage, beside execution (asynchronous policies)
    LOOP     plans the next wave and runs stage 0 on it; under lockstep it first runs a
             whole admission round whenever requests wait (the mechanism lockstep tests);
             under trtllm-pp and sglang-pp it runs those frameworks' iterations instead
             (outside_loop.py)
    RESULTS  receives first tokens from the last stage and completes requests, and the stages'
             KV export reports (a request that exports ends at its last report; live_requests.py)
    DEADLINES answers a hand-off whose parts are not all reported kv_export_wait_s after it ended

Leader state is shared under one lock (`cond`); the stage's pool has its own lock
(StageRuntime). Every change a waiting thread may care about notifies `cond`.

Callers (the Engine, the server through it) use the public methods below; an outside loop
uses the LoopHost part (loop_host.py). The caller's request ids: live_requests.py.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Callable

import torch

from wavepp.cache import CapacityView
from wavepp.runtime.channels import Channels, PeerLostError, Shutdown
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.live_requests import LiveRequests
from wavepp.runtime.loop_host import PlannedWave
from wavepp.runtime.outside_loop import OutsideLoop
from wavepp.runtime.profile import WaveProfile, profile_pipeline
from wavepp.runtime.protocol import (
    CheckIntegrity, EngineError, ExportReport, IntegrityReport, Reset, ResultMsg, StageTiming, WaveHeader)
from wavepp.runtime.rounds_plane import RoundsPlane, start_stages
from wavepp.runtime.runtime_leader import build_runtime_leader
from wavepp.runtime.stats import CoreStats, EngineLoad
from wavepp.sched import WaveResult, get_policy
from wavepp.sched.rounds import run_round


class EngineCore:
    def __init__(self, config: RuntimeConfig, channels: Channels,
                 check_alive: Callable[[float], str | None] = lambda wait_s: None):
        """Load stage 0 here and wait for every other stage to load. Threads start in start()."""
        self.config = config
        self.channels = channels
        self.num_stages = config.num_stages
        self._check_alive = check_alive
        self.stage, self.stage_num_blocks, self._worker_kernels = start_stages(config, channels)
        self._plane = RoundsPlane(channels, self.stage, self.num_stages)
        self.max_prompt_tokens = self.stage.model_config.max_position_embeddings
        self.vocab_size = self.stage.model_config.vocab_size
        self.profile: WaveProfile | None = None
        if config.profile_waves:
            self.profile = profile_pipeline(self.stage, channels, self.stage_num_blocks, self.max_prompt_tokens)
        self.cond = threading.Condition(threading.RLock())
        self.error: str | None = None
        self._stopping = False
        self._t0 = time.perf_counter()
        self._requests = LiveRequests(self.num_stages)
        self._on_done: Callable = lambda request_id, req, export_errors: (request_id, req)
        if self.stage.exporter is not None:     # stage 0's parts are reported here, on its writer
            self.stage.exporter.on_outcome = lambda outcome: self.on_export_report(ExportReport((outcome,)))
        self.snapshot_align_frac = config.snapshot_align_frac
        self._build_leader(config.policy)
        loops = [("wavepp-wave", self._wave_loop), ("wavepp-loop", self._exec_loop),
                 ("wavepp-results", self._result_loop)]
        if config.kv_store:     # last: shutdown joins the threads in this order
            loops.append(("wavepp-export-deadlines", lambda: self._requests.answer_overdue(
                self.cond, self.now, config.kv_export_wait_s, lambda *a: self._on_done(*a), lambda: self._stopping)))
        self._threads = [threading.Thread(target=self._guard(fn), name=name, daemon=True) for name, fn in loops]

    def start(self, on_done: Callable) -> None:
        """Start the threads; `on_done(request_id, request, export_errors)` gives each future
        its value (export_errors: {stage: why} of the request's KV parts that failed)."""
        self._on_done = on_done
        for t in self._threads:
            t.start()

    # ---- API (any thread) --------------------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def submit(self, request_id: int | None, token_ids, *, logprob_start: int | None = None,
               export_id: str | None = None) -> Future:
        """Queue a request under the caller's id (None: the next free automatic id), with its
        options: the request is created with them, so no round sees it without them.
        `logprob_start`, `export_id`: see Leader.add_request. An id in use by an unfinished request, or an
        option the prompt cannot take, is refused with ValueError, and nothing is queued."""
        with self.cond:
            self._raise_if_closed()
            internal_id, fut = self._requests.add(request_id, exports=export_id is not None)
            try:
                self.leader.add_request(internal_id, token_ids, self.now(), logprob_start=logprob_start,
                                        export_id=export_id)
            except ValueError:
                self._requests.remove(internal_id)
                raise
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

    def reset(self, policy: str | None = None, snapshot_interval_blocks: int | None = None,
              snapshot_align_frac: float | None = None) -> None:
        """Empty every stage's cache and (optionally) switch policy and, for a hybrid model, the
        snapshot grid: every stage takes the same one, so the leader's agreed boundaries stay
        ones every stage can hold. Waits for idle."""
        policy = policy or self.policy.name
        get_policy(policy, runtime=True)
        if snapshot_interval_blocks is not None and snapshot_interval_blocks < 1:
            raise ValueError(f"snapshot_interval_blocks must be >= 1, got {snapshot_interval_blocks}")
        if snapshot_align_frac is not None and not 0 <= snapshot_align_frac < 1:
            raise ValueError(f"snapshot_align_frac must be in [0, 1), got {snapshot_align_frac}")
        with self.cond:
            self._wait_idle()
            self.stage.reset(policy, snapshot_interval_blocks)
            if snapshot_align_frac is not None:
                self.snapshot_align_frac = snapshot_align_frac
            self._build_leader(policy)
            self._plane.ask_workers(Reset(policy, snapshot_interval_blocks))

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
            return self._stats.snapshot(rounds_since)

    @property
    def num_live_requests(self) -> int:
        with self.cond:
            return len(self._requests)

    def shutdown(self) -> None:
        """Stop every thread and stage; requests not finished by then fail with EngineError."""
        with self.cond:
            if self._stopping and not any(t.is_alive() for t in self._threads):
                self._fail_all("the engine was shut down before the request finished")
                return
            self._stopping = True
            self.cond.notify_all()
        started = [t for t in self._threads if t.ident is not None]
        for t in started[:2]:
            t.join(timeout=10)
        if self.num_stages > 1 and not self.error:
            try:
                self._plane.tell_workers(Shutdown())
                self.channels.send_obj(Shutdown(), 1, "headers")
            except PeerLostError:
                pass
        for t in started[2:]:
            t.join(timeout=10)
        self.stage.close()
        with self.cond:
            self._fail_all(self.error or "the engine was shut down before the request finished")

    # ---- the outside loop's host (LoopHost, loop_host.py) ------------------------------------

    def serves(self, loop) -> bool:
        """Under cond: the engine runs and `loop` is its outside loop."""
        return not self._stopping and self._outside is loop

    def idle(self) -> bool:
        """Under cond: nothing is waiting, in a round, planned or in flight."""
        return self.leader.idle

    def has_waiting(self) -> bool:
        """Under cond: a request waits that may enter a round now."""
        return self.leader.has_waiting

    def run_round(self) -> None:
        """One admission round with every stage (the shared driver; this is its transport)."""
        t0, t0_unix = self.now(), time.time()
        outcome = run_round(self.leader, self._plane.exchange, self.now, self.cond)
        if outcome is None:
            return
        with self.cond:
            self.record_round(outcome.round_id, outcome.latency_s, t0_unix, t0_unix + self.now() - t0)
            self._deliver()
            self.cond.notify_all()

    def broadcast_round(self, msg) -> list:
        """Send a rounds-plane message to every stage (stage 0 locally); their replies in
        stage order."""
        return self._plane.broadcast(msg)

    def record_round(self, round_id: int, latency_s: float, start_unix_s: float, end_unix_s: float) -> None:
        """Count an exchange as a round in the stats (round id -1: nothing to admit)."""
        with self.cond:
            self._stats.record_round(round_id, latency_s, start_unix_s, end_unix_s)

    def plan_wave(self) -> PlannedWave | None:
        """The leader's next wave and its prompt tokens; None if there is nothing to send or
        the ring is full."""
        with self.cond:
            wave = self.leader.plan_wave(self.now())
            if wave is None:
                return None
            requests = self.leader.requests
            return PlannedWave(wave, [t for c in wave.chunks
                                      for t in requests[c.request_id].token_ids[c.start:c.end]])

    def launch(self, planned: PlannedWave, idle_since: float, admission_s: float) -> ResultMsg | None:
        """Run stage 0 on the wave and send it on; with one stage, its result (see LoopHost)."""
        wave = planned.wave
        start, start_unix = time.perf_counter(), time.time()
        wait_s = max(0.0, start - max(idle_since, self.stage.epoch) - admission_s)
        output, compute_s = self.stage.run(wave, torch.tensor(planned.token_ids, dtype=torch.int64))
        timing = StageTiming(0, wait_s, compute_s, admission_s, start_unix)
        if self.num_stages == 1:
            return ResultMsg(wave.wave_id, tuple(output), (timing,))
        self.channels.send_obj(WaveHeader(wave, (timing,)), 1, "headers")
        if output is not None:
            self.channels.send_tensor(output, 1)
        return None

    def on_wave_result(self, msg: ResultMsg) -> None:
        """A wave back from the last stage: its timings into the stats, its tokens to the
        leader, and the requests it finished to their futures."""
        with self.cond:
            wave = self.leader.waves_in_flight.get(msg.wave_id)
            shapes = tuple((c.start, c.num_tokens) for c in wave.chunks) if wave is not None else ()
            self._stats.record_wave(msg.wave_id, shapes, msg.timings)
            self.leader.on_wave_result(WaveResult(msg.wave_id, msg.tokens, tuple(t.compute_s for t in msg.timings)),
                                       self.now())
            self._deliver()
            self.cond.notify_all()

    def on_export_report(self, report: ExportReport) -> None:
        """Stages' KV export outcomes: counted; a finished request whose parts are all reported
        ends (its future resolves, naming the parts that failed)."""
        with self.cond:
            for outcome in report.outcomes:
                self._requests.report(outcome, self._on_done)

    def export_counts(self) -> tuple[int, int]:
        """KV parts the stages reported (written, failed) since the engine started."""
        with self.cond:
            return self._requests.num_exports_written, self._requests.num_exports_failed

    # ---- threads -----------------------------------------------------------------------------

    def _wave_loop(self) -> None:
        while True:
            with self.cond:
                while not self._stopping and (self.policy.inline_admission or self.leader.round is not None
                                              or not self.leader.has_waiting):
                    self.cond.wait()
                if self._stopping:
                    return
            self.run_round()

    def _exec_loop(self) -> None:
        idle_since = time.perf_counter()
        pending_admission = 0.0
        while True:
            with self.cond:
                if self._stopping:
                    return
                outside = self._outside
                inline = self.policy.inline_admission and self.leader.has_waiting and self.leader.round is None
            if outside is not None:
                outside.iterate()
                continue
            if inline:
                t0 = time.perf_counter()
                self.run_round()
                pending_admission += time.perf_counter() - t0
                continue
            with self.cond:
                planned = self.plan_wave()
                if planned is None:
                    starving = not self.leader.plannable and (self.leader.round is not None or self.leader.waiting)
                    t0 = time.perf_counter()
                    self.cond.wait()
                    if starving:
                        pending_admission += time.perf_counter() - t0
                    continue
            result = self.launch(planned, idle_since, pending_admission)
            pending_admission = 0.0
            if result is not None:
                self.on_wave_result(result)
            idle_since = time.perf_counter()

    def _result_loop(self) -> None:
        if self.num_stages == 1:
            return
        while True:
            msg = self.channels.recv_obj(self.num_stages - 1, "results")
            if isinstance(msg, Shutdown):
                return
            if isinstance(msg, ExportReport):
                self.on_export_report(msg)
            elif self._outside is not None:    # retired by LOOP, P-1 iterations after its launch
                self._outside.hold(msg)
            else:
                self.on_wave_result(msg)

    # ---- helpers -----------------------------------------------------------------------------

    def _deliver(self) -> None:
        """Under cond: resolve the future of every request the leader finished (one that exports
        its KV: once every stage reported its part)."""
        for req in self.leader.take_finished():
            self._requests.finish(req, self._on_done, self.now())

    def _build_leader(self, policy: str) -> None:
        self.policy = get_policy(policy, runtime=True)
        self.leader = build_runtime_leader(
            self.policy, num_stages=self.num_stages, block_size=self.config.block_size,
            stage_num_blocks=self.stage_num_blocks, max_prompt_tokens=self.max_prompt_tokens,
            hybrid=self.stage.layout.is_hybrid, snapshot_interval_blocks=self.stage.snapshot_interval_blocks,
            snapshot_align_frac=self.snapshot_align_frac, profile=self.profile)
        self._outside = OutsideLoop(self) if self.policy.loop is not None else None
        self._stats = CoreStats.empty(self.num_stages)

    def _wait_idle(self) -> None:
        """Under cond: until nothing is waiting, planned or in flight (or the engine stopped)."""
        self._raise_if_closed()
        while not self.leader.idle and not self._stopping:
            self.cond.wait()
        self._raise_if_closed()

    def _raise_if_closed(self) -> None:
        if self.error:
            raise EngineError(self.error)
        if self._stopping:
            raise EngineError("the engine is shut down")

    def _fail_all(self, reason: str) -> None:
        """Under cond: every unfinished request's future fails with EngineError(reason)."""
        for fut in self._requests.remove_all():
            if not fut.done():
                fut.set_exception(EngineError(reason))

    def fail(self, reason: str) -> None:
        """Fatal: record the first reason, fail every unfinished request with it, stop."""
        with self.cond:
            if self.error is None:
                self.error = reason
            self._stopping = True
            self._fail_all(self.error)
            self.cond.notify_all()

    def _guard(self, fn):
        def run():
            try:
                fn()
            except PeerLostError as exc:
                # a lost peer is most often a dead stage: name it (waiting briefly for its exit)
                self.fail(self._check_alive(1.0) or str(exc))
            except Exception as exc:   # noqa: BLE001 - a bug or a rejected plan: stop loudly
                self.fail(f"rank 0 ({threading.current_thread().name}): {type(exc).__name__}: {exc}")
        return run
