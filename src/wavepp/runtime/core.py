"""Rank 0: the leader and stage 0, in three threads.

    WAVE     admission rounds with every stage, beside execution (asynchronous policies)
    LOOP     plans the next wave and runs stage 0 on it; under lockstep it first runs a
             whole admission round whenever requests wait (the mechanism lockstep tests);
             under trtllm-pp and sglang-pp it runs those frameworks' iterations instead
             (outside_loop.py)
    RESULTS  receives first tokens from the last stage and completes requests

Leader state is shared under one lock (`cond`); the stage's pool has its own lock
(StageRuntime). Every change a waiting thread may care about notifies `cond`.

Request ids: callers name requests (any int, or an automatic one); the leader and the stages
see an internal id that is never reused, so an id is free again as soon as its request ended,
whatever of it is still being released on the stages.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future
from typing import Callable

import torch

from wavepp.runtime.channels import Channels, PeerLostError, Shutdown
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.profile import (
    MIN_PROFILE_SHAPES, ProfileWaves, WaveProfile, fit_profile, profile_shapes, time_stage_waves)
from wavepp.runtime.outside_loop import OutsideLoop
from wavepp.runtime.protocol import (
    CheckIntegrity, IntegrityReport, LoadFailed, Reset, ResultMsg, Setup, StageTiming, WaveHeader)
from wavepp.runtime.stage import StageRuntime
from wavepp.runtime.stats import CoreStats
from wavepp.sched import Leader, LeaderConfig, PlannerConfig, ReleaseMsg, WaveResult, get_policy, make_planner
from wavepp.sched.cost_model import CostModel
from wavepp.sched.policy import loop_leader_args, loop_planner_args
from wavepp.sched.rounds import run_round


RUNTIME_MPU_TOKENS = (512, 256)    # (microbatch M, b_min) of wavepp-mpu on the CPU runtime


class EngineError(RuntimeError):
    """The pipeline cannot go on (a stage died, or a stage rejected the leader's plan), or the
    engine was shut down."""


class EngineCore:
    def __init__(self, config: RuntimeConfig, channels: Channels,
                 check_alive: Callable[[float], str | None] = lambda wait_s: None):
        """Load stage 0 here and wait for every other stage to load. Threads start in start()."""
        self.config = config
        self.channels = channels
        self.num_stages = config.num_stages
        self._check_alive = check_alive
        for rank in range(1, self.num_stages):
            channels.send_obj(Setup(config), rank, "rounds")
        torch.set_num_threads(config.num_threads)
        self.stage = StageRuntime(config, 0, channels.device)
        blocks, kernels = [self.stage.num_blocks], [""]
        for rank in range(1, self.num_stages):
            msg = channels.recv_obj(rank, "replies")
            if isinstance(msg, LoadFailed):
                raise EngineError(msg.reason)
            blocks.append(msg.num_blocks)
            kernels.append(msg.kernels)
        self.stage_num_blocks = tuple(blocks)
        self._worker_kernels = tuple(kernels)
        self.max_prompt_tokens = self.stage.model_config.max_position_embeddings
        self.profile: WaveProfile | None = self._profile() if config.profile_waves else None
        self.cond = threading.Condition(threading.RLock())
        self.error: str | None = None
        self._stopping = False
        self._t0 = time.perf_counter()
        # caller's id -> internal id, and internal id -> (caller's id, future): live requests only
        self._live: dict[int, int] = {}
        self._futures: dict[int, tuple[int, Future]] = {}
        self._internal_ids = itertools.count()
        self._auto_ids = itertools.count()
        self._on_done: Callable = lambda request_id, req: (request_id, req)
        self.snapshot_align_frac = config.snapshot_align_frac
        self._build_leader(config.policy)
        self._threads = [threading.Thread(target=self._guard(fn), name=name, daemon=True)
                         for name, fn in (("wavepp-wave", self._wave_loop), ("wavepp-loop", self._exec_loop),
                                          ("wavepp-results", self._result_loop))]

    def start(self, on_done: Callable) -> None:
        """Start the threads; `on_done(request_id, request)` gives each future its value."""
        self._on_done = on_done
        for t in self._threads:
            t.start()

    # ---- API (any thread) --------------------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def submit(self, request_id: int | None, token_ids) -> Future:
        """Queue a request under the caller's id (None: the next free automatic id). An id in
        use by an unfinished request is refused with ValueError, and nothing is queued."""
        with self.cond:
            self._raise_if_closed()
            if request_id is None:
                request_id = next(i for i in self._auto_ids if i not in self._live)
            elif request_id in self._live:
                raise ValueError(f"request id {request_id} is already in use by a request that "
                                 f"has not finished")
            internal_id = next(self._internal_ids)
            self.leader.add_request(internal_id, token_ids, self.now())
            fut: Future = Future()
            fut.request_id = request_id      # for abort(), whichever id it got
            self._live[request_id] = internal_id
            self._futures[internal_id] = (request_id, fut)
            self._deliver()
            self.cond.notify_all()
        return fut

    def abort(self, request_id: int) -> None:
        """Abort the caller's request at any step; an unknown or finished id is ignored."""
        with self.cond:
            internal_id = self._live.get(request_id)
            if internal_id is None:
                return
            self.leader.abort(internal_id, self.now())
            self._deliver()
            self.cond.notify_all()

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
            for rank in range(1, self.num_stages):
                self.channels.send_obj(Reset(policy, snapshot_interval_blocks), rank, "rounds")
            for rank in range(1, self.num_stages):
                self._recv_reply(rank)

    def check_integrity(self) -> list[IntegrityReport]:
        """Every stage's check_integrity() and capacity, once the pipeline is idle."""
        with self.cond:
            self._wait_idle()
            out = [self.stage.check_integrity()]
            for rank in range(1, self.num_stages):
                self.channels.send_obj(CheckIntegrity(), rank, "rounds")
            for rank in range(1, self.num_stages):
                out.append(self._recv_reply(rank).detail)
            return out

    def stage_kernels(self) -> tuple[str, ...]:
        """Each stage's kernel paths: rank 0's as its process runs them now, the other ranks' as
        they reported at start-up (each its own process)."""
        return (self.stage.kernels(),) + self._worker_kernels[1:]

    def stats(self) -> CoreStats:
        """A consistent snapshot of the measurements since the last reset."""
        with self.cond:
            return self._stats.snapshot()

    @property
    def num_live_requests(self) -> int:
        with self.cond:
            return len(self._live)

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
                for rank in range(1, self.num_stages):
                    self.channels.send_obj(Shutdown(), rank, "rounds")
                self.channels.send_obj(Shutdown(), 1, "headers")
            except PeerLostError:
                pass
        for t in started[2:]:
            t.join(timeout=10)
        with self.cond:
            self._fail_all(self.error or "the engine was shut down before the request finished")

    # ---- threads -----------------------------------------------------------------------------

    def _wave_loop(self) -> None:
        while True:
            with self.cond:
                while not self._stopping and (self.policy.inline_admission or self.leader.round is not None
                                              or not self.leader.has_waiting):
                    self.cond.wait()
                if self._stopping:
                    return
            self._round()

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
                self._round()
                pending_admission += time.perf_counter() - t0
                continue
            with self.cond:
                wave = self.leader.plan_wave(self.now())
                if wave is None:
                    starving = not self.leader.plannable and (self.leader.round is not None or self.leader.waiting)
                    t0 = time.perf_counter()
                    self.cond.wait()
                    if starving:
                        pending_admission += time.perf_counter() - t0
                    continue
                tokens = [t for c in wave.chunks for t in self.leader.requests[c.request_id].token_ids[c.start:c.end]]
            start = time.perf_counter()
            start_unix = time.time()
            wait_s = max(0.0, start - max(idle_since, self.stage.epoch) - pending_admission)
            inputs = torch.tensor(tokens, dtype=torch.int64)
            output, compute_s = self.stage.run(wave, inputs)
            timing = StageTiming(0, wait_s, compute_s, pending_admission, start_unix)
            pending_admission = 0.0
            if self.num_stages == 1:
                self._on_result(ResultMsg(wave.wave_id, tuple(output), (timing,)))
            else:
                self.channels.send_obj(WaveHeader(wave, (timing,)), 1, "headers")
                if output is not None:
                    self.channels.send_tensor(output, 1)
            idle_since = time.perf_counter()

    def _result_loop(self) -> None:
        if self.num_stages == 1:
            return
        while True:
            msg = self.channels.recv_obj(self.num_stages - 1, "results")
            if isinstance(msg, Shutdown):
                return
            if self._outside is not None:    # retired by LOOP, P-1 iterations after its launch
                self._outside.hold(msg)
            else:
                self._on_result(msg)

    # ---- helpers -----------------------------------------------------------------------------

    def _round(self) -> None:
        """One admission round with every stage (the shared driver; this is its transport)."""
        t0, t0_unix = self.now(), time.time()
        outcome = run_round(self.leader, self._exchange, self.now, self.cond)
        if outcome is None:
            return
        with self.cond:
            self._stats.num_rounds += 1
            self._stats.round_latencies_s.append(outcome.latency_s)
            self._stats.round_spans.append((outcome.round_id, t0_unix, t0_unix + self.now() - t0))
            self._deliver()
            self.cond.notify_all()

    def _exchange(self, msg):
        """Send a rounds-plane message to every stage (stage 0 locally); their replies in stage
        order, or None for a release (no reply)."""
        if isinstance(msg, ReleaseMsg):
            for rank in range(1, self.num_stages):
                self.channels.send_obj(msg, rank, "rounds")
            self.stage.handle_round(msg)
            return None
        if not len(msg):   # nothing to ask: the empty answers, without a message
            return [msg.empty_reply(s) for s in range(self.num_stages)]
        for rank in range(1, self.num_stages):
            self.channels.send_obj(msg, rank, "rounds")
        replies = [self.stage.handle_round(msg)]
        replies += [self._recv_reply(rank) for rank in range(1, self.num_stages)]
        return replies

    def _recv_reply(self, rank: int):
        return self.channels.recv_obj(rank, "replies")

    def _profile(self) -> WaveProfile | None:
        """The start-up profiling pass (runtime/profile.py): every stage times the same waves
        at once; the planner's cost model starts from the fit to the slowest stage. None where
        it does not apply (hybrid models) or too few waves fit the cache."""
        if self.stage.layout.is_hybrid:
            return None
        shapes = profile_shapes(self.config.block_size, self.max_prompt_tokens, min(self.stage_num_blocks))
        if len(shapes) < MIN_PROFILE_SHAPES:
            return None
        t0 = time.perf_counter()
        for rank in range(1, self.num_stages):
            self.channels.send_obj(ProfileWaves(shapes), rank, "rounds")
        seconds = [time_stage_waves(self.stage, shapes)]
        seconds += [self._recv_reply(rank).detail.seconds for rank in range(1, self.num_stages)]
        return fit_profile(shapes, seconds, time.perf_counter() - t0)

    def _on_result(self, msg: ResultMsg) -> None:
        with self.cond:
            wave = self.leader.waves_in_flight.get(msg.wave_id)
            shapes = tuple((c.start, c.num_tokens) for c in wave.chunks) if wave is not None else ()
            stats = self._stats
            for t in msg.timings:
                if shapes:
                    stats.stage_samples.append((t.stage_id, shapes, t.compute_s))
                stats.wave_spans.append((t.stage_id, msg.wave_id, t.start_unix_s, t.start_unix_s + t.compute_s))
                st = stats.stages[t.stage_id]
                st.busy_s += t.compute_s
                st.idle_input_s += t.wait_s
                st.round_s += t.round_s
                st.num_waves += 1
                if t.stage_id == 0:
                    st.idle_admission_s += t.round_s
            stats.num_waves += 1
            self.leader.on_wave_result(WaveResult(msg.wave_id, msg.tokens, tuple(t.compute_s for t in msg.timings)),
                                       self.now())
            self._deliver()
            self.cond.notify_all()

    def _deliver(self) -> None:
        """Under cond: resolve the future of every request the leader finished."""
        for req in self.leader.take_finished():
            request_id, fut = self._futures.pop(req.request_id)
            del self._live[request_id]
            if not fut.done():
                fut.set_result(self._on_done(request_id, req))

    def _build_leader(self, policy: str) -> None:
        self.policy = get_policy(policy, runtime=True)
        cfg = self.config
        loop = self.policy.loop       # an outside loop's budget, slots and serial chunks
        # MPU's paper budgets (16,384 / 8,192) in the ratio of this runtime's 512-token waves
        pcfg = PlannerConfig(block_size=cfg.block_size, num_stages=self.num_stages,
                             mpu_microbatch_tokens=RUNTIME_MPU_TOKENS[0], mpu_min_tokens=RUNTIME_MPU_TOKENS[1],
                             snapshot_interval_blocks=self.stage.snapshot_interval_blocks,
                             snapshot_align_frac=self.snapshot_align_frac, **loop_planner_args(loop))
        # the cost-model planners start from the profiling pass's fit, then refine it online
        profiled = self.profile is not None and self.policy.planner in ("balanced", "dynamic")
        kwargs = {"cost_model": CostModel(self.profile.coefficients)} if profiled else {}
        self.leader = Leader(LeaderConfig(self.num_stages, cfg.block_size, stage_num_blocks=self.stage_num_blocks,
                                          max_prompt_tokens=self.max_prompt_tokens,
                                          hybrid=self.stage.layout.is_hybrid,
                                          **loop_leader_args(loop, self.num_stages)),
                             make_planner(self.policy.planner, pcfg, **kwargs))
        self._outside = OutsideLoop(self) if loop is not None else None
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
        for _, fut in self._futures.values():
            if not fut.done():
                fut.set_exception(EngineError(reason))
        self._futures.clear()
        self._live.clear()

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
                self.fail(f"{type(exc).__name__}: {exc}")
        return run
