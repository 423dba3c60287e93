"""What the pipeline measured about itself: per-stage time, rounds, waves (CoreStats); and
what it holds right now (EngineLoad).

Per-stage time is split the same way in the runtime, the simulator, the bench's JSON and the
README: busy (computing waves), idle for input (nothing to run), idle for admission (rank 0
waiting on a round, or the pipeline starved while one runs), and round time on LOOP.

A long-running engine keeps bounded state: the per-wave and per-round records below are the
most recent `max_records` of each (a window), the totals count everything since the last reset.
"""

from __future__ import annotations

import collections
import copy
import itertools
from dataclasses import dataclass, field

from wavepp.sched.stats import StageStats

MAX_RECORDS = 100_000


@dataclass(frozen=True)
class EngineLoad:
    """What the engine holds right now (a server's admission control reads it).

    num_waiting: queued or in an admission round, not yet admitted on every stage.
    num_running: admitted on every stage, computing.
    error: why the pipeline cannot go on (a dead stage, named), or None."""

    num_waiting: int
    num_running: int
    error: str | None


@dataclass
class CoreStats:
    stages: list[StageStats]
    max_records: int = MAX_RECORDS
    num_waves: int = 0
    num_rounds: int = 0
    # the most recent records, in wall-clock (unix) seconds:
    #   round_latencies_s  one per round
    #   wave_spans         (stage, wave id, start, end)
    #   round_spans        (round id, start, end)
    #   stage_samples      (stage, ((num_cached, num_new) per chunk), compute seconds): what a
    #                      cost model is fitted to
    round_latencies_s: collections.deque = field(default=None)
    wave_spans: collections.deque = field(default=None)
    round_spans: collections.deque = field(default=None)
    stage_samples: collections.deque = field(default=None)

    def __post_init__(self) -> None:
        for name in ("round_latencies_s", "wave_spans", "round_spans", "stage_samples"):
            if getattr(self, name) is None:
                setattr(self, name, collections.deque(maxlen=self.max_records))

    @classmethod
    def empty(cls, num_stages: int, max_records: int = MAX_RECORDS) -> "CoreStats":
        return cls([StageStats() for _ in range(num_stages)], max_records)

    def record_round(
        self, round_id: int, latency_s: float, start_unix_s: float, end_unix_s: float
    ) -> None:
        """One admission round (round id -1: an exchange with nothing to admit), and its span."""
        self.num_rounds += 1
        self.round_latencies_s.append(latency_s)
        self.round_spans.append((round_id, start_unix_s, end_unix_s))

    def record_wave(self, wave_id: int, shapes: tuple[tuple[int, int], ...], timings) -> None:
        """One wave back from the last stage: every stage's StageTiming of it, added to that
        stage's time. `shapes`: its chunks' (num_cached, num_new), what a cost model is fitted
        to (empty when unknown: no sample is recorded)."""
        for t in timings:
            if shapes:
                self.stage_samples.append((t.stage_id, shapes, t.compute_s))
            self.wave_spans.append(
                (t.stage_id, wave_id, t.start_unix_s, t.start_unix_s + t.compute_s)
            )
            st = self.stages[t.stage_id]
            st.busy_s += t.compute_s
            st.idle_input_s += t.wait_s
            st.round_s += t.round_s
            st.num_waves += 1
            if t.stage_id == 0:
                st.idle_admission_s += t.round_s
        self.num_waves += 1

    def snapshot(self, rounds_since: int | None = None) -> "CoreStats":
        """A consistent copy (take it under the owner's lock); the records become lists.

        rounds_since: the totals only, and the latencies of the rounds after the first
        `rounds_since` (what a metrics scrape needs): its cost under the lock is bounded by the
        rounds since the last scrape, not by the whole window of records."""
        out = copy.copy(self)
        out.stages = [copy.copy(s) for s in self.stages]
        if rounds_since is not None:
            new = max(0, min(self.num_rounds - rounds_since, len(self.round_latencies_s)))
            out.round_latencies_s = list(itertools.islice(reversed(self.round_latencies_s), new))[
                ::-1
            ]
            out.wave_spans, out.round_spans, out.stage_samples = [], [], []
            return out
        for name in ("round_latencies_s", "wave_spans", "round_spans", "stage_samples"):
            setattr(out, name, list(getattr(self, name)))
        return out
