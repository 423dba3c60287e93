"""Rank 0's loops: the three threads, and the host an outside loop runs on (LoopHost).

EngineCore (core.py) holds one `CoreLoops`; core.py has the public API and the lifecycle, this
file how rank 0 runs:

    WAVE     admission rounds with every stage, beside execution (asynchronous policies)
    LOOP     plans the next wave and runs stage 0 on it (StageRunner.step); under lockstep it
             first runs a whole admission round whenever requests wait; under trtllm-pp and
             sglang-pp it runs those frameworks' iterations instead (outside_loop.py)
    RESULTS  receives first tokens (and the stages' KV export reports) from the last stage

It owns what only the loops use: the threads, stage 0's StageRunner, the outside loop, the
stats, and whether it is stopping. From the core it takes the lock (`cond`, guarding the leader
and this object's state), the leader it drives, the rounds plane, and four calls back: the
clock, the delivery of finished requests, the export reports, and what to do when a thread
fails.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import torch

from wavepp.runtime.channels import Channels, Shutdown
from wavepp.runtime.core_stats import CoreStats
from wavepp.runtime.loop_host import PlannedWave
from wavepp.runtime.outside_loop import OutsideLoop
from wavepp.runtime.protocol import ExportReport, ResultMsg
from wavepp.runtime.rounds_plane import RoundsPlane
from wavepp.runtime.stage import StageRuntime
from wavepp.runtime.stage_runner import StageRunner
from wavepp.sched import Leader, Policy, WaveResult
from wavepp.sched.rounds import run_round


class CoreLoops:
    def __init__(
        self,
        stage: StageRuntime,
        channels: Channels,
        plane: RoundsPlane,
        cond: threading.Condition,
        leader: Leader,
        policy: Policy,
        *,
        now: Callable[[], float],
        deliver: Callable[[], None],
        on_export_report: Callable[[ExportReport], None],
        on_crash: Callable[[Exception], None],
    ):
        """The threads are made here and started by start(). `deliver()` (under cond) resolves
        what the leader finished; `on_crash(exc)` runs on the thread that raised, which ends."""
        self.num_stages = plane.num_stages
        self.cond = cond
        self.leader = leader
        self.policy = policy
        self.stopping = False
        self.stats = CoreStats.empty(self.num_stages)
        self.outside: OutsideLoop | None = OutsideLoop(self) if policy.loop is not None else None
        self._runner = StageRunner(stage, channels, self.num_stages)
        self._channels = channels
        self._plane = plane
        self._now = now
        self._deliver = deliver
        self._on_export_report = on_export_report
        self._on_crash = on_crash
        self._loop = self._thread("wavepp-loop", self._exec_loop)  # stage 0's forward
        self._drivers = (self._thread("wavepp-wave", self._wave_loop), self._loop)
        self._results = self._thread("wavepp-results", self._result_loop)

    # ---- lifecycle (the core) ----------------------------------------------------------------

    def start(self) -> None:
        for t in (*self._drivers, self._results):
            t.start()

    @property
    def compute_thread_ids(self) -> tuple[int, ...]:
        """The native ids of the threads that run stage 0's forward (LOOP), once started."""
        return () if self._loop.native_id is None else (self._loop.native_id,)

    def reset(self, leader: Leader, policy: Policy) -> None:
        """Under cond, while the leader is idle: drive `leader` under `policy` from now. The
        stats start over; an outside loop is a new one (the old one returns: it no longer
        serves)."""
        self.leader, self.policy = leader, policy
        self.outside = OutsideLoop(self) if policy.loop is not None else None
        self.stats = CoreStats.empty(self.num_stages)

    def stop(self) -> None:
        """The loops stop: WAVE and LOOP return at their next wait; every waiter is woken."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    @property
    def alive(self) -> bool:
        return any(t.is_alive() for t in (*self._drivers, self._results))

    def join_drivers(self, timeout: float) -> None:
        """Wait for WAVE and LOOP (after stop()): nothing new reaches the stages from here."""
        for t in self._drivers:
            if t.ident is not None:
                t.join(timeout=timeout)

    def join_results(self, timeout: float) -> None:
        """Wait for RESULTS (after the last stage was told to shut down)."""
        if self._results.ident is not None:
            self._results.join(timeout=timeout)

    # ---- the outside loop's host (LoopHost, loop_host.py) ------------------------------------

    def serves(self, loop) -> bool:
        """Under cond: the engine runs and `loop` is its outside loop."""
        return not self.stopping and self.outside is loop

    def idle(self) -> bool:
        """Under cond: nothing is waiting, in a round, planned or in flight."""
        return self.leader.idle

    def has_waiting(self) -> bool:
        """Under cond: a request waits that may enter a round now."""
        return self.leader.has_waiting

    def run_round(self) -> None:
        """One admission round with every stage (the shared driver; this is its transport)."""
        t0, t0_unix = self._now(), time.time()
        outcome = run_round(self.leader, self._plane.exchange, self._now, self.cond)
        if outcome is None:
            return
        with self.cond:
            self.record_round(
                outcome.round_id, outcome.latency_s, t0_unix, t0_unix + self._now() - t0
            )
            self._deliver()
            self.cond.notify_all()

    def broadcast_round(self, msg) -> list:
        """Send a rounds-plane message to every stage (stage 0 locally); their replies in
        stage order."""
        return self._plane.broadcast(msg)

    def record_round(
        self, round_id: int, latency_s: float, start_unix_s: float, end_unix_s: float
    ) -> None:
        """Count an exchange as a round in the stats (round id -1: nothing to admit)."""
        with self.cond:
            self.stats.record_round(round_id, latency_s, start_unix_s, end_unix_s)

    def plan_wave(self) -> PlannedWave | None:
        """The leader's next wave and its prompt tokens; None if there is nothing to send or
        the ring is full."""
        with self.cond:
            wave = self.leader.plan_wave(self._now())
            if wave is None:
                return None
            requests = self.leader.requests
            return PlannedWave(
                wave,
                [t for c in wave.chunks for t in requests[c.request_id].token_ids[c.start : c.end]],
            )

    def launch(self, planned: PlannedWave, admission_s: float = 0.0) -> ResultMsg | None:
        """Run stage 0 on the wave and send it on (StageRunner); with one stage, its result."""
        self._runner.note_admission(admission_s)
        return self._runner.step(planned.wave, torch.tensor(planned.token_ids, dtype=torch.int64))

    def stage_idle(self) -> None:
        """Stage 0 has nothing to run from now (an outside loop waiting for work)."""
        self._runner.mark_idle()

    def on_wave_result(self, msg: ResultMsg) -> None:
        """A wave back from the last stage: its timings into the stats, its tokens to the
        leader, and the requests it finished to their futures."""
        with self.cond:
            wave = self.leader.waves_in_flight.get(msg.wave_id)
            shapes = tuple((c.start, c.num_tokens) for c in wave.chunks) if wave is not None else ()
            self.stats.record_wave(msg.wave_id, shapes, msg.timings)
            self.leader.on_wave_result(
                WaveResult(msg.wave_id, msg.tokens, tuple(t.compute_s for t in msg.timings)),
                self._now(),
            )
            self._deliver()
            self.cond.notify_all()

    # ---- threads -----------------------------------------------------------------------------

    def _wave_loop(self) -> None:
        while True:
            with self.cond:
                while not self.stopping and (
                    self.policy.inline_admission
                    or self.leader.round is not None
                    or not self.leader.has_waiting
                ):
                    self.cond.wait()
                if self.stopping:
                    return
            self.run_round()

    def _exec_loop(self) -> None:
        runner = self._runner
        while True:
            with self.cond:
                if self.stopping:
                    return
                outside = self.outside
                inline = (
                    runner.rounds_on_loop and self.leader.has_waiting and self.leader.round is None
                )
            if outside is not None:
                outside.iterate()
                continue
            if inline:
                t0 = time.perf_counter()
                self.run_round()
                runner.note_admission(time.perf_counter() - t0)
                continue
            with self.cond:
                planned = self.plan_wave()
                if planned is None:
                    self._wait_for_work()
                    continue
            result = self.launch(planned)
            if result is not None:
                self.on_wave_result(result)
                runner.mark_idle()

    def _result_loop(self) -> None:
        if self.num_stages == 1:
            return
        while True:
            msg = self._channels.recv_obj(self.num_stages - 1, "results")
            if isinstance(msg, Shutdown):
                return
            if isinstance(msg, ExportReport):
                self._on_export_report(msg)
            elif self.outside is not None:  # retired by LOOP, P-1 iterations after its launch
                self.outside.hold(msg)
            else:
                self.on_wave_result(msg)

    # ---- helpers -----------------------------------------------------------------------------

    def _wait_for_work(self) -> None:
        """Under cond, on LOOP with no wave to plan: wait for a change. If the pipeline starves
        while a round runs (or requests wait for one), the wait counts as stage 0's time on
        admission, not idle for input."""
        starving = not self.leader.plannable and (
            self.leader.round is not None or self.leader.waiting
        )
        t0 = time.perf_counter()
        self.cond.wait()
        if starving:
            self._runner.note_admission(time.perf_counter() - t0)

    def _thread(self, name: str, fn: Callable[[], None]) -> threading.Thread:
        def run():
            try:
                fn()
            except Exception as exc:  # a lost peer, a bug, a rejected plan: the core names it
                self._on_crash(exc)

        return threading.Thread(target=run, name=name, daemon=True)
