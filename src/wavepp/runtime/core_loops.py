"""Rank 0's driving half: the three threads and what an outside loop needs (LoopHost).

`CoreLoops` is mixed into EngineCore (core.py), whose state it shares under `cond`: the
leader, stage 0's StageRunner, the rounds plane, the stats. core.py holds the public API and
the lifecycle; this file holds how rank 0 runs:

    WAVE     admission rounds with every stage, beside execution (asynchronous policies)
    LOOP     plans the next wave and runs stage 0 on it (StageRunner.step); under lockstep it
             first runs a whole admission round whenever requests wait; under trtllm-pp and
             sglang-pp it runs those frameworks' iterations instead (outside_loop.py)
    RESULTS  receives first tokens (and the stages' KV export reports) from the last stage
"""

from __future__ import annotations

import time

import torch

from wavepp.runtime.channels import Shutdown
from wavepp.runtime.loop_host import PlannedWave
from wavepp.runtime.protocol import ExportReport, ResultMsg
from wavepp.sched import WaveResult
from wavepp.sched.rounds import run_round


class CoreLoops:
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
            self.record_round(
                outcome.round_id, outcome.latency_s, t0_unix, t0_unix + self.now() - t0
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
            self._stats.record_round(round_id, latency_s, start_unix_s, end_unix_s)

    def plan_wave(self) -> PlannedWave | None:
        """The leader's next wave and its prompt tokens; None if there is nothing to send or
        the ring is full."""
        with self.cond:
            wave = self.leader.plan_wave(self.now())
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
            self._stats.record_wave(msg.wave_id, shapes, msg.timings)
            self.leader.on_wave_result(
                WaveResult(msg.wave_id, msg.tokens, tuple(t.compute_s for t in msg.timings)),
                self.now(),
            )
            self._deliver()
            self.cond.notify_all()

    # ---- threads -----------------------------------------------------------------------------

    def _wave_loop(self) -> None:
        while True:
            with self.cond:
                while not self._stopping and (
                    self.policy.inline_admission
                    or self.leader.round is not None
                    or not self.leader.has_waiting
                ):
                    self.cond.wait()
                if self._stopping:
                    return
            self.run_round()

    def _exec_loop(self) -> None:
        runner = self._runner
        while True:
            with self.cond:
                if self._stopping:
                    return
                outside = self._outside
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
                    starving = not self.leader.plannable and (
                        self.leader.round is not None or self.leader.waiting
                    )
                    t0 = time.perf_counter()
                    self.cond.wait()
                    if starving:
                        runner.note_admission(time.perf_counter() - t0)
                    continue
            result = self.launch(planned)
            if result is not None:
                self.on_wave_result(result)
                runner.mark_idle()

    def _result_loop(self) -> None:
        if self.num_stages == 1:
            return
        while True:
            msg = self.channels.recv_obj(self.num_stages - 1, "results")
            if isinstance(msg, Shutdown):
                return
            if isinstance(msg, ExportReport):
                self.on_export_report(msg)
            elif self._outside is not None:  # retired by LOOP, P-1 iterations after its launch
                self._outside.hold(msg)
            else:
                self.on_wave_result(msg)
