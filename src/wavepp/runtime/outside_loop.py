"""TensorRT-LLM's and SGLang's pipeline loops on rank 0's LOOP thread (`trtllm-pp`, `sglang-pp`).

Both frameworks run one iteration per microbatch on every rank, with P microbatch slots
(P = the number of stages). Here rank 0's LOOP runs that iteration (sim/loops/loop_sim.py
models the same loops step by step, on every rank):

    iteration i                                   TensorRT-LLM              SGLang
      exchange  every stage hears from rank 0,    fetch, the schedule       recv_requests down
                whether or not requests wait:     propagated, every rank's  the ranks, every
                an admission round over what      scheduler and             rank's get_next_batch
                waits (every stage matches its    prepare_resources         (its own radix cache)
                own cache, leases, escrows), or
                the empty request list, answered
      plan      the microbatch of slot i mod P    a request with a chunk    chunks of one request
                (at most P in flight)             in flight waits           may be in flight
                                                  (serial chunks), fixed    together; dynamic
                                                  budget                    chunk sizes
      launch    stage 0 runs it and sends it on   forward                   run_batch
      retire    the batch of slot (i+1) mod P,    sample-state relay,       outputs of slot mb+1,
                launched P-1 iterations ago:      _handle_executed_batch    process_batch_result
                wait for its result, then the
                leader finishes its requests

Where the runtime's structure differs from the frameworks': the stages answer the exchange on
their WAVE thread beside their compute (the frameworks' ranks do this host work between their
forwards: in the baselines' favour); the leader needs every stage's answer, since the stages'
caches differ (the frameworks' ranks reach the same decision without answering), so a round
trip per phase is on rank 0's path (against them; the price of per-stage caches under an inline
loop); the last stage's result comes straight back to rank 0 instead of round the ring (in their
favour). Nothing waits on a timer: every pause is a message or a result not yet there.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

from wavepp.runtime.core_stats import MAX_RECORDS
from wavepp.runtime.loop_host import LoopHost
from wavepp.runtime.protocol import ResultMsg
from wavepp.sched import ProbeMsg


@dataclass
class LoopWave:
    """One launched microbatch: its chunks as (request id, start, num_tokens, is_last), the
    iteration that launched it, the one that retired it, and whether that iteration's exchange
    admitted anything (a round) or only passed the empty request list."""

    wave_id: int
    chunks: tuple[tuple[int, int, int, bool], ...]
    launched: int
    admitted: bool
    retired: int | None = None


class OutsideLoop:
    """Rank 0's side of an outside loop. `iterate()` runs on LOOP; `hold()` on RESULTS. It
    reaches the engine only through `host` (LoopHost, loop_host.py)."""

    def __init__(self, host: LoopHost):
        self.host = host
        self.num_slots = host.num_stages
        self.slots: list[int | None] = [None] * self.num_slots  # wave id in each slot
        self.slot = 0
        self.iteration = 0
        self.num_exchanges = 0  # rounds, and exchanges with nothing to admit
        self.records: collections.deque[LoopWave] = collections.deque(maxlen=MAX_RECORDS)
        self._launched: dict[int, LoopWave] = {}
        self._results: dict[int, ResultMsg] = {}

    def hold(self, msg: ResultMsg) -> None:
        """A result from the last stage: kept until its batch's slot comes round again."""
        with self.host.cond:
            self._results[msg.wave_id] = msg
            self.host.cond.notify_all()

    def iterate(self) -> None:
        """One iteration: exchange, plan, launch, retire. Returns at once if the engine stops;
        waits (on the engine's condition) while nothing is waiting, planned or in a slot, and
        returns when a reset replaced this loop."""
        host = self.host
        with host.cond:
            while host.serves(self) and host.idle() and not any(s is not None for s in self.slots):
                host.stage_idle()
                host.cond.wait()
            if not host.serves(self):  # stopped, or reset to a new policy
                return
            admit = host.has_waiting()
        t0 = time.perf_counter()
        if admit:
            host.run_round()
        else:
            self._pass_empty_list()
        exchange_s = time.perf_counter() - t0
        self.num_exchanges += 1
        self._launch(exchange_s, admit)
        self._retire((self.slot + 1) % self.num_slots)
        self.slot = (self.slot + 1) % self.num_slots
        self.iteration += 1

    # ---- steps -------------------------------------------------------------------------------

    def _pass_empty_list(self) -> None:
        """The iteration's request list with nothing in it, to every stage and answered: the
        chain a framework's ranks block on every microbatch. Counted as a round."""
        t0, t0_unix = time.perf_counter(), time.time()
        self.host.broadcast_round(ProbeMsg(-1, ()))
        latency = time.perf_counter() - t0
        self.host.record_round(-1, latency, t0_unix, t0_unix + latency)

    def _launch(self, exchange_s: float, admitted: bool) -> None:
        host = self.host
        with host.cond:
            planned = host.plan_wave()
            if planned is None:
                return
            wave = planned.wave
            record = LoopWave(
                wave.wave_id,
                tuple((c.request_id, c.start, c.num_tokens, c.is_last) for c in wave.chunks),
                self.iteration,
                admitted,
            )
            self.records.append(record)
            self._launched[wave.wave_id] = record
        self.slots[self.slot] = wave.wave_id
        result = host.launch(planned, exchange_s)
        if result is not None:  # a single stage: its result is here already
            self.hold(result)

    def _retire(self, slot: int) -> None:
        """Wait for the result of the batch in `slot`, then hand it to the leader. (A reset
        cannot replace this loop meanwhile: it waits for the leader to be idle, and the batch
        is in flight until it is retired; so `serves` here means "not stopped".)"""
        wave_id = self.slots[slot]
        if wave_id is None:
            return
        host = self.host
        with host.cond:
            while wave_id not in self._results and host.serves(self):
                host.cond.wait()
            if not host.serves(self):
                return
            msg = self._results.pop(wave_id)
            self._launched.pop(wave_id).retired = self.iteration
            self.slots[slot] = None
            host.on_wave_result(msg)
