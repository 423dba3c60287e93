"""What the pipeline measured about itself: per-stage time, rounds, waves.

Per-stage time is split the same way in the runtime, the simulator, the bench's JSON and the
README: busy (computing waves), idle for input (nothing to run), idle for admission (rank 0
waiting on a round, or the pipeline starved while one runs), and round time on LOOP.

A long-running engine keeps bounded state: the per-wave and per-round records below are the
most recent `max_records` of each (a window), the totals count everything since the last reset.
"""

from __future__ import annotations

import collections
import copy
from dataclasses import dataclass, field

from wavepp.sched.stats import StageStats

MAX_RECORDS = 100_000


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

    def snapshot(self) -> "CoreStats":
        """A consistent copy (take it under the owner's lock); the records become lists."""
        out = copy.copy(self)
        out.stages = [copy.copy(s) for s in self.stages]
        for name in ("round_latencies_s", "wave_spans", "round_spans", "stage_samples"):
            setattr(out, name, list(getattr(self, name)))
        return out
