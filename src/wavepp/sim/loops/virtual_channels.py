"""The channels between the ranks of an outside executor loop (loop_sim.py), in virtual time.

Each rank's loop is a generator that yields operations: sleep, receive, wait for work. An
operation is a function of the coroutine's `resume`; it calls `resume` (with the payload, for a
receive) when the rank may go on. A message sent arrives `hop_s` later, in order per
(source, destination, kind).
"""

from __future__ import annotations

import collections
from typing import Callable, Generator

from wavepp.sim.core.events import EventLoop

Op = Callable[[Callable], None]  # an operation a rank's coroutine yields: op(resume)


class VirtualChannels:
    """The message queues between ranks and the one idle waiter (rank 0, waiting for work).

    Owns its queues and waiters; schedules every delivery and resumption on `loop`.
    `has_work()` says whether rank 0 has anything to schedule (the owner's leader decides)."""

    def __init__(self, loop: EventLoop, hop_s: float, has_work: Callable[[], bool]):
        self.loop = loop
        self.hop_s = hop_s
        self._has_work = has_work
        # (src, dst, kind) -> payloads that arrived before their receive
        self._queues: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
        self._waiters: dict[tuple, Callable] = {}  # (src, dst, kind) -> the blocked receive
        self._idle_waiter: Callable | None = None

    def start(self, gen: Generator) -> None:
        """Run coroutine `gen` from the next event on: each operation it yields resumes it."""

        def step(value=None):
            try:
                op = gen.send(value)
            except StopIteration:
                return
            op(step)

        self.loop.after(0.0, step)

    def sleep(self, seconds: float) -> Op:
        return lambda resume: self.loop.after(seconds, resume)

    def send(self, src: int, dst: int, kind: str, payload) -> None:
        """Post a message to rank `dst`; it arrives hop_s later, in order per (src, dst, kind):
        to the receive blocked on it, else into its queue."""
        key = (src, dst, kind)

        def arrive():
            waiter = self._waiters.pop(key, None)
            if waiter is not None:
                waiter(payload)
            else:
                self._queues[key].append(payload)

        self.loop.after(self.hop_s, arrive)

    def recv(self, src: int, dst: int, kind: str) -> Op:
        """The next message of (src, dst, kind): resumes with its payload at once if it is
        queued, else when it arrives."""
        key = (src, dst, kind)

        def op(resume):
            if self._queues[key]:
                payload = self._queues[key].popleft()
                self.loop.after(0.0, lambda: resume(payload))
            else:
                self._waiters[key] = resume

        return op

    def wait_for_work(self) -> Op:
        """Resume at once if there is work, else at the next `kick` that finds some."""

        def op(resume):
            if self._has_work():
                self.loop.after(0.0, resume)
            else:
                self._idle_waiter = resume

        return op

    def kick(self) -> None:
        """Something changed (a request arrived, a round ended): wake the idle rank if there is
        work now."""
        if self._idle_waiter is not None and self._has_work():
            resume, self._idle_waiter = self._idle_waiter, None
            self.loop.after(0.0, resume)
