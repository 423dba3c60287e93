"""One stage's wave step, the same on every rank.

    runner = StageRunner(stage, channels, num_stages)
    runner.note_admission(seconds)     # time on admission since the last wave: not idle for input
    result = runner.step(wave, inputs, timings)   # run the stage, then send the output on
    runner.mark_idle()                 # the stage has nothing to do from now

A step measures the stage's wait (from when it was last idle, less the admission time noted
since), runs the stage on the wave, appends the stage's StageTiming to the ones the wave
carries, and sends the output on: to the next stage (the header, then the activations), or from
the last stage its ResultMsg to rank 0. Rank 0 differs only in what feeds it (the leader's
planned wave and its prompt tokens, core.py) and, with a single stage, in where the result
goes: `step` returns it to the caller instead of sending it to itself.

Lockstep (`rounds_on_loop`): under a policy that admits inline and has no outside loop, a
stage answers admission rounds on the thread that runs its waves, between them; every rank
decides it with this one rule.
"""

from __future__ import annotations

import time

from wavepp.runtime.channels import Channels
from wavepp.runtime.protocol import ResultMsg, StageTiming, WaveHeader
from wavepp.runtime.stage import StageRuntime
from wavepp.sched import Wave


class StageRunner:
    def __init__(self, stage: StageRuntime, channels: Channels, num_stages: int):
        self.stage = stage
        self.channels = channels
        self.rank = channels.rank
        self.is_last = self.rank == num_stages - 1
        self._idle_since = time.perf_counter()
        self._admission_s = 0.0

    @property
    def rounds_on_loop(self) -> bool:
        """Admission rounds run on the stage's wave thread, between waves (lockstep)."""
        policy = self.stage.policy
        return policy.inline_admission and policy.loop is None

    def note_admission(self, seconds: float) -> None:
        self._admission_s += seconds

    def mark_idle(self) -> None:
        self._idle_since = time.perf_counter()

    def step(self, wave: Wave, inputs, timings: tuple[StageTiming, ...] = ()) -> ResultMsg | None:
        """Run the stage on `wave` (rank 0: its prompt tokens; the others: the activations
        received) and send the output on. Returns the ResultMsg only where rank 0 is the last
        stage (a single stage); else None."""
        start, start_unix = time.perf_counter(), time.time()
        admission_s, self._admission_s = self._admission_s, 0.0
        wait_s = max(0.0, start - max(self._idle_since, self.stage.epoch) - admission_s)
        output, compute_s = self.stage.run(wave, inputs)
        timings = timings + (StageTiming(self.rank, wait_s, compute_s, admission_s, start_unix),)
        result = None
        if self.is_last:
            result = ResultMsg(wave.wave_id, tuple(output), timings)
            if self.rank != 0:
                self.channels.send_obj(result, 0, "results")
                result = None
        else:
            self.channels.send_obj(WaveHeader(wave, timings), self.rank + 1, "headers")
            if output is not None:
                self.channels.send_tensor(output, self.rank + 1)
        self.mark_idle()
        return result
