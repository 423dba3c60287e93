"""Rank 0: the leader and stage 0, in three threads.

    WAVE     admission rounds with every stage, beside execution (asynchronous policies)
    LOOP     plans the next wave and runs stage 0 on it; under lockstep it first runs a
             whole admission round whenever requests wait (the mechanism lockstep tests)
    RESULTS  receives first tokens from the last stage and completes requests

Leader state is shared under one lock; the stage's pool has its own lock (StageRuntime).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import torch

from wavepp.runtime.channels import Channels, PeerLostError, Shutdown
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.protocol import (
    Ack, CheckIntegrity, Reset, ResultMsg, Setup, StageReady, StageTiming, WaveHeader)
from wavepp.runtime.stage import StageRuntime
from wavepp.sched import (
    CommitReply, Leader, LeaderConfig, LeaseReply, PlannerConfig, ProbeReply, ReleaseMsg, RequestState,
    WaveResult, get_policy, make_planner)


class EngineError(RuntimeError):
    """The pipeline cannot go on (a stage died, or a stage rejected the leader's plan)."""


@dataclass
class StageStats:
    busy_s: float = 0.0
    wait_input_s: float = 0.0
    wait_admission_s: float = 0.0
    round_s: float = 0.0
    num_waves: int = 0


@dataclass
class CoreStats:
    stages: list[StageStats]
    round_latencies_s: list[float] = field(default_factory=list)
    # (stage, wave id, start, end) and (round id, start, end), in wall-clock (unix) seconds
    wave_spans: list[tuple[int, int, float, float]] = field(default_factory=list)
    round_spans: list[tuple[int, float, float]] = field(default_factory=list)
    # (stage, ((num_cached, num_new) per chunk), compute seconds): what a cost model is fitted to
    stage_samples: list[tuple[int, tuple[tuple[int, int], ...], float]] = field(default_factory=list)
    num_waves: int = 0


class EngineCore:
    def __init__(self, config: RuntimeConfig, channels: Channels,
                 check_alive: Callable[[], str | None] = lambda: None):
        self.config = config
        self.channels = channels
        self.num_stages = config.num_stages
        self._check_alive = check_alive
        for rank in range(1, self.num_stages):
            channels.send_obj(Setup(config), rank, "rounds")
        torch.set_num_threads(config.num_threads)
        self.stage = StageRuntime(config, 0)
        blocks = [self.stage.num_blocks]
        for rank in range(1, self.num_stages):
            msg = channels.recv_obj(rank, "replies")
            if not isinstance(msg, StageReady):
                raise EngineError(str(msg.detail))
            blocks.append(msg.num_blocks)
        self.stage_num_blocks = tuple(blocks)
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.futures: dict[int, Future] = {}
        self.on_done: Callable | None = None     # (request, token result | None) -> value for the future
        self.error: str | None = None
        self._stopping = False
        self._t0 = time.perf_counter()
        self._build_leader(config.policy)
        self._threads = [threading.Thread(target=self._guard(fn), name=name, daemon=True)
                         for name, fn in (("wavepp-wave", self._wave_loop), ("wavepp-loop", self._exec_loop),
                                          ("wavepp-results", self._result_loop))]
        for t in self._threads:
            t.start()

    # ---- API (any thread) --------------------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def submit(self, request_id: int, token_ids) -> Future:
        fut: Future = Future()
        with self.cond:
            if self.error:
                raise EngineError(self.error)
            self.futures[request_id] = fut
            req = self.leader.add_request(request_id, token_ids, self.now())
            if req.state.finished:
                self._complete(req)
            self.cond.notify_all()
        return fut

    def abort(self, request_id: int) -> None:
        with self.cond:
            req = self.leader.requests.get(request_id)
            if req is None or req.state.finished:
                return
            self.leader.abort(request_id, self.now())
            if req.state.finished:
                self._complete(req)
            self.cond.notify_all()

    def reset(self, policy: str | None = None) -> None:
        """Empty every stage's cache and (optionally) switch policy. Waits for idle."""
        policy = policy or self.policy.name
        get_policy(policy)
        with self.cond:
            self._wait_idle()
            self.stage.reset(policy)
            self._build_leader(policy)
            for rank in range(1, self.num_stages):
                self.channels.send_obj(Reset(policy), rank, "rounds")
            for rank in range(1, self.num_stages):
                self._recv_reply(rank)

    def check_integrity(self) -> list[tuple]:
        """Every stage's (capacity, number of live requests), after check_integrity() (idle)."""
        with self.cond:
            self._wait_idle()
            with self.stage.lock:
                self.stage.server.pool.check_integrity()
                out = [(self.stage.server.pool.capacity(), len(self.stage.server.requests))]
            for rank in range(1, self.num_stages):
                self.channels.send_obj(CheckIntegrity(), rank, "rounds")
            for rank in range(1, self.num_stages):
                out.append(self._recv_reply(rank).detail)
            return out

    def shutdown(self) -> None:
        with self.cond:
            if self._stopping:
                return
            self._stopping = True
            self.cond.notify_all()
        for t in self._threads[:2]:
            t.join(timeout=10)
        if self.num_stages > 1 and not self.error:
            try:
                for rank in range(1, self.num_stages):
                    self.channels.send_obj(Shutdown(), rank, "rounds")
                self.channels.send_obj(Shutdown(), 1, "headers")
            except PeerLostError:
                pass
        self._threads[2].join(timeout=10)

    # ---- threads -----------------------------------------------------------------------------

    def _wave_loop(self) -> None:
        while True:
            with self.cond:
                while not self._stopping and (self.policy.inline_admission or self.leader.round is not None
                                              or not self.leader.has_waiting):
                    self.cond.wait(0.1)
                if self._stopping:
                    return
            self._run_round()

    def _exec_loop(self) -> None:
        idle_since = time.perf_counter()
        pending_admission = 0.0
        while True:
            with self.cond:
                if self._stopping:
                    return
                inline = self.policy.inline_admission and self.leader.has_waiting and self.leader.round is None
            if inline:
                t0 = time.perf_counter()
                self._run_round()
                pending_admission += time.perf_counter() - t0
                continue
            with self.cond:
                wave = self.leader.plan_wave(self.now())
                if wave is None:
                    starving = not self.leader.plannable and (self.leader.round is not None or self.leader.waiting)
                    t0 = time.perf_counter()
                    self.cond.wait(0.05)
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
            self._on_result(msg)

    # ---- helpers -----------------------------------------------------------------------------

    def _run_round(self) -> None:
        with self.cond:
            msg = self.leader.start_round(self.now())
        if msg is None:
            return
        t0 = self.now()
        replies = self._exchange(msg, ProbeReply, "hints")
        with self.cond:
            lease = self.leader.on_probe_replies(replies)
        replies = self._exchange(lease, LeaseReply, "results")
        with self.cond:
            commit, release = self.leader.on_lease_replies(replies, self.now())
        if release is not None:
            self._send_all(release)
        replies = self._exchange(commit, CommitReply, "results")
        with self.cond:
            outcome, release = self.leader.on_commit_replies(replies, self.now())
        if release is not None:
            self._send_all(release)
        with self.cond:
            self.stats.round_latencies_s.append(outcome.latency)
            self.stats.round_spans.append((outcome.round_id, time.time() - (self.now() - t0), time.time()))
            for req in outcome.failed:
                self._complete(req)
            for req in list(self.leader.requests.values()):
                if req.state == RequestState.ABORTED and req.request_id in self.futures:
                    self._complete(req)
            self.cond.notify_all()

    def _exchange(self, msg, reply_type, field_name: str) -> list:
        """Send a rounds-plane message to every stage (stage 0 locally); gather the replies."""
        items = getattr(msg, "items", getattr(msg, "request_ids", ()))
        if not items:   # nothing to ask: the empty answers, without a message
            return [reply_type(msg.round_id, s, ()) for s in range(self.num_stages)]
        for rank in range(1, self.num_stages):
            self.channels.send_obj(msg, rank, "rounds")
        replies = [self.stage.handle_round(msg)]
        replies += [self._recv_reply(rank) for rank in range(1, self.num_stages)]
        return replies

    def _send_all(self, msg: ReleaseMsg) -> None:
        for rank in range(1, self.num_stages):
            self.channels.send_obj(msg, rank, "rounds")
        self.stage.handle_round(msg)

    def _recv_reply(self, rank: int):
        return self.channels.recv_obj(rank, "replies")

    def _on_result(self, msg: ResultMsg) -> None:
        with self.cond:
            wave = self.leader.waves_in_flight.get(msg.wave_id)
            shapes = tuple((c.start, c.num_tokens) for c in wave.chunks) if wave is not None else ()
            for t in msg.timings:
                if shapes:
                    self.stats.stage_samples.append((t.stage_id, shapes, t.compute_s))
                self.stats.wave_spans.append((t.stage_id, msg.wave_id, t.start_unix_s, t.start_unix_s + t.compute_s))
                st = self.stats.stages[t.stage_id]
                st.busy_s += t.compute_s
                st.wait_input_s += t.wait_s
                st.round_s += t.round_s
                st.num_waves += 1
                if t.stage_id == 0:
                    st.wait_admission_s += t.round_s
            self.stats.num_waves += 1
            result = WaveResult(msg.wave_id, msg.tokens, tuple(t.compute_s for t in msg.timings))
            tokens = {t.request_id: t for t in msg.tokens}
            for req in self.leader.on_wave_result(result, self.now()):
                self._complete(req, tokens.get(req.request_id))
            self.cond.notify_all()

    def _complete(self, req, token=None) -> None:
        fut = self.futures.pop(req.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(self.on_done(req, token) if self.on_done else (req, token))

    def _build_leader(self, policy: str) -> None:
        self.policy = get_policy(policy)
        cfg = self.config
        pcfg = PlannerConfig(block_size=cfg.block_size, num_stages=self.num_stages)
        self.leader = Leader(LeaderConfig(self.num_stages, cfg.block_size,
                                          stage_num_blocks=self.stage_num_blocks),
                             make_planner(self.policy.planner, pcfg))
        self.stats = CoreStats([StageStats() for _ in range(self.num_stages)])

    def _wait_idle(self) -> None:
        """Under self.cond: until nothing is waiting, planned or in flight (or the engine died)."""
        while not self.leader.idle and not self.error:
            self.cond.wait(0.05)
        self._raise_if_dead()

    def _raise_if_dead(self) -> None:
        if self.error:
            raise EngineError(self.error)

    def fail(self, reason: str) -> None:
        """Fatal: record the first reason, fail every unfinished request with it, stop."""
        with self.cond:
            if self.error is None:
                self.error = reason
            self._stopping = True
            for fut in self.futures.values():
                if not fut.done():
                    fut.set_exception(EngineError(self.error))
            self.futures.clear()
            self.cond.notify_all()

    def _guard(self, fn):
        def run():
            try:
                fn()
            except PeerLostError as exc:
                time.sleep(0.3)     # the launcher's watchdog usually has the better reason by now
                self.fail(self._check_alive() or str(exc))
            except Exception as exc:   # noqa: BLE001 - a bug or a rejected plan: stop loudly
                self.fail(f"{type(exc).__name__}: {exc}")
        return run
