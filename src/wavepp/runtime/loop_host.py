"""What an outside loop (outside_loop.py) needs of rank 0's loops, and nothing more.

Rank 0's CoreLoops (core_loops.py) implements it: it owns stage 0's runner, the outside loop
and the stats. An outside loop runs TensorRT-LLM's or SGLang's iteration on LOOP:

    iterate    under cond: wait while serves(loop) and idle() and no slot holds a batch
      exchange   has_waiting(): run_round()
                 else: broadcast_round(empty probe), then record_round(-1, ...)
      launch     plan_wave() (under cond, with the loop's own record), then launch(...)
      retire     under cond: wait for the slot's result (held by the loop), then on_wave_result()

`cond` guards the host's state and the loop's own (its held results), and every wait is on
it: the host notifies it on every change a waiting thread may care about (a request queued, a
round over, a wave back, a stop). It is re-entrant: the host's methods take it themselves, so
they may be called with it held or not, except where one says "under cond".
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Protocol

from wavepp.runtime.protocol import ResultMsg
from wavepp.sched import Wave


class PlannedWave(NamedTuple):
    """A wave the leader planned, and its input: the prompt tokens of its chunks, in order."""

    wave: Wave
    token_ids: list[int]


class LoopHost(Protocol):
    num_stages: int
    cond: threading.Condition

    def serves(self, loop: object) -> bool:
        """Under cond: the engine runs and `loop` is still its loop (a reset replaces it)."""

    def idle(self) -> bool:
        """Under cond: nothing is waiting, in a round, planned or in flight."""

    def has_waiting(self) -> bool:
        """Under cond: a request waits that may enter a round now."""

    def run_round(self) -> None:
        """One admission round over the waiting requests with every stage, recorded in the
        stats; the requests it ended are delivered."""

    def broadcast_round(self, msg) -> list:
        """Send a rounds-plane message to every stage (stage 0 answers here, in this thread)
        and wait for every answer: the replies in stage order. Records nothing."""

    def record_round(
        self, round_id: int, latency_s: float, start_unix_s: float, end_unix_s: float
    ) -> None:
        """Count one exchange as a round in the stats (round id -1: nothing was admitted)."""

    def plan_wave(self) -> PlannedWave | None:
        """The leader's next wave, or None when there is nothing to send or the ring is full."""

    def launch(self, planned: PlannedWave, admission_s: float = 0.0) -> ResultMsg | None:
        """Run stage 0 on the wave and send it on to stage 1 (StageRunner.step). `admission_s`:
        of the time since stage 0 was last idle, spent on admission (not counted idle for
        input). With a single stage, the wave's result (for the caller to deliver), else None
        (the last stage sends it back)."""

    def stage_idle(self) -> None:
        """Stage 0 has nothing to run from now: its wait for input starts here."""

    def on_wave_result(self, msg: ResultMsg) -> None:
        """A wave's result: record its timings, let the leader finish its requests, deliver
        the ones that ended."""
