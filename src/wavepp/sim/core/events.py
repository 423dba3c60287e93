"""A minimal discrete-event loop: a heap of (time, sequence, callback)."""

from __future__ import annotations

import heapq
from typing import Callable


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.num_events = 0

    def at(self, time: float, fn: Callable[[], None]) -> None:
        if time < self.now:
            raise ValueError(f"event scheduled in the past: {time} < {self.now}")
        heapq.heappush(self._heap, (time, self._seq, fn))
        self._seq += 1

    def after(self, delay: float, fn: Callable[[], None]) -> None:
        self.at(self.now + delay, fn)

    def run(
        self,
        *,
        until: float = float("inf"),
        max_events: int = 50_000_000,
        after_event: Callable[[], None] | None = None,
    ) -> None:
        while self._heap and self._heap[0][0] <= until:
            time, _, fn = heapq.heappop(self._heap)
            self.now = time
            fn()
            self.num_events += 1
            if after_event is not None:
                after_event()
            if self.num_events >= max_events:
                raise RuntimeError(f"event loop exceeded {max_events} events at t={self.now}")

    @property
    def empty(self) -> bool:
        return not self._heap

    @property
    def next_time(self) -> float:
        """When the next event is due (inf when none is)."""
        return self._heap[0][0] if self._heap else float("inf")
