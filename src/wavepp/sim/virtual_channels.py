"""The coroutine plumbing of LoopSim (loops.py): each rank's executor loop is a generator that
yields operations (sleep, receive, wait for work); a message sent arrives `hop_s` later, in
order per (source, destination, kind). Mixed into LoopSim, whose event loop (`loop`), loop
costs (`lc`), leader, channels (`_chan`, `_chan_waiter`) and idle waiter it uses."""

from __future__ import annotations

from typing import Generator


class LoopPlumbing:
    def _start(self, gen: Generator) -> None:
        def step(value=None):
            try:
                op = gen.send(value)
            except StopIteration:
                return
            op(step)

        self.loop.after(0.0, step)

    def _sleep(self, seconds: float):
        return lambda resume: self.loop.after(seconds, resume)

    def _send(self, src: int, dst: int, kind: str, payload) -> None:
        """Post a message to rank `dst`; it arrives hop_s later, in order per (src, dst, kind)."""
        key = (src, dst, kind)

        def arrive():
            waiter = self._chan_waiter.pop(key, None)
            if waiter is not None:
                waiter(payload)
            else:
                self._chan[key].append(payload)

        self.loop.after(self.lc.hop_s, arrive)

    def _recv(self, src: int, dst: int, kind: str):
        key = (src, dst, kind)

        def op(resume):
            if self._chan[key]:
                payload = self._chan[key].popleft()
                self.loop.after(0.0, lambda: resume(payload))
            else:
                self._chan_waiter[key] = resume

        return op

    def _wait_for_work(self):
        def op(resume):
            if self._has_work():
                self.loop.after(0.0, resume)
            else:
                self._idle_waiter = resume

        return op

    def _has_work(self) -> bool:
        return bool(self.leader.has_waiting or self.leader.plannable or self.leader.waves_in_flight)

    def _kick(self) -> None:
        if self._idle_waiter is not None and self._has_work():
            resume, self._idle_waiter = self._idle_waiter, None
            self.loop.after(0.0, resume)
