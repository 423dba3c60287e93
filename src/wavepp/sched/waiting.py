"""The requests waiting for an admission round, in the order rounds take them.

    fcfs      by arrival: a request that comes back (deferred by a round, refused for room,
              sent back with a withdrawn owner) keeps its place, so later arrivals that fit
              better never pass it again and again
    priority  by priority (lower first, as vLLM's `priority`), then by arrival; a request's
              priority improves by one every `aging_s` it waits, so none starves: one of
              priority p waits at most about (p - q) * aging_s behind a stream of priority q

The leader also orders the admitted requests' chunks by the same key (`key`), so a request of
higher priority goes into the next wave ahead of lower ones already admitted.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator

from wavepp.sched.request import Request

POLICIES = ("fcfs", "priority")


class WaitingQueue:
    def __init__(self, policy: str = "fcfs", aging_s: float = 10.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"scheduling policy must be one of {POLICIES}, got {policy!r}")
        if not aging_s > 0:
            raise ValueError(f"aging_s must be > 0, got {aging_s}")
        self.policy = policy
        self.aging_s = aging_s
        self._items: list[Request] = []  # by (priority, arrival seq) under priority, else seq

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)

    def __contains__(self, req: Request) -> bool:
        return req in self._items

    def key(self, req: Request, now: float) -> tuple[float, int]:
        """Where `req` goes among others at `now`: (effective priority, arrival sequence)."""
        if self.policy == "fcfs":
            return (0, req.seq)
        aged = math.floor(max(0.0, now - req.arrival_time) / self.aging_s)
        return (req.priority - aged, req.seq)

    def push(self, req: Request) -> None:
        """Queue `req` at its place (by its static key; aging applies when rounds take)."""
        bisect.insort(self._items, req, key=lambda r: (self._static(r), r.seq))

    def remove(self, req: Request) -> None:
        self._items.remove(req)

    def take(self, limit: int, ready: Callable[[Request], bool], now: float) -> list[Request]:
        """Up to `limit` requests that are `ready`, best first at `now`; the rest stay."""
        order = self._items
        if self.policy == "priority":
            order = sorted(order, key=lambda r: self.key(r, now))
        batch: list[Request] = []
        for req in order:
            if len(batch) >= limit:
                break
            if ready(req):
                batch.append(req)
        taken = set(map(id, batch))
        self._items = [r for r in self._items if id(r) not in taken]
        return batch

    def _static(self, req: Request) -> int:
        return req.priority if self.policy == "priority" else 0
