"""The decode side's pulls off vLLM's step: a thread of their own runs them one at a time, each
into a puller (a registered buffer) of its own, and the step that comes after one ended writes
its rows into vLLM's cache.

    pulls = BackgroundPulls(host=None, protocol="tcp", timeout_s=10.0)
    pulls.submit(key, stages, start, end)
    for end in pulls.finished(wait_s=0.0):        # PullEnd: key, rows ({layer: {pool: tensor}}
        ...                                       # or PullFailed), wait_s, pull_s; write the
                                                  # rows (valid until done(key))
        pulls.done(key, stages)                   # release the parts on their stages; the
                                                  # puller takes the next pull
    pulls.close()

One thread and one transfer engine for every pull and release: the engine sees one call at a
time, as it does when the step pulls for itself. Up to `max_held` pullers hold rows the step has
not written yet; a pull waits for one of them to be done. A pull from a host that stopped
answering holds the thread for up to twice the transfer timeout (engine.py): the pulls queued
behind it wait that long, and vLLM's step does not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import NamedTuple

from wavepp.kv_transfer.mooncake.engine import DEFAULT_TIMEOUT_S
from wavepp.kv_transfer.mooncake.puller import ArenaPuller, PullFailed

log = logging.getLogger(__name__)

MAX_HELD = 4  # pulls whose rows are held, not yet written by the step


class PullEnd(NamedTuple):
    key: Hashable
    result: object  # {model layer: {pool: rows}}, or PullFailed
    wait_s: float  # submitted to started
    pull_s: float  # started to ended


class BackgroundPulls:
    def __init__(
        self,
        host: str | None = None,
        protocol: str = "tcp",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_held: int = MAX_HELD,
    ):
        self.host, self.protocol, self.timeout_s = host, protocol, timeout_s
        self.max_held = max_held
        self._pullers: list[ArenaPuller] = []  # the first starts (and owns) the engine
        self._free: list[ArenaPuller] = []
        self._held: dict[Hashable, ArenaPuller] = {}  # pulled (or failed), not yet done
        self._queue: deque[tuple[Hashable, list[dict], int, int, float]] = deque()
        self._releases: deque[tuple[list[dict], str | None]] = deque()
        self._finished: deque[PullEnd] = deque()
        self._running = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    # ---- the step's side ---------------------------------------------------------------------
    def submit(self, key: Hashable, stages: list[dict], start: int, end: int) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the background pulls are closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="wavepp-kv-pulls", daemon=True
                )
                self._thread.start()
            self._queue.append((key, stages, start, end, time.monotonic()))
            self._cond.notify_all()

    def finished(self, wait_s: float = 0.0) -> list[PullEnd]:
        """The pulls that ended since the last call. Waits up to `wait_s` for one when none
        has and some are under way."""
        with self._cond:
            if not self._finished and wait_s > 0 and (self._queue or self._running):
                self._cond.wait(wait_s)
            out = list(self._finished)
            self._finished.clear()
        return out

    def done(self, key: Hashable, stages: list[dict], skip_host: str | None = None) -> None:
        """The step is done with `key`'s rows: release its parts on their stages (but those on
        `skip_host`, left to their TTL) and give its puller to the next pull."""
        with self._cond:
            puller = self._held.pop(key, None)
            if puller is not None:
                self._free.append(puller)
            self._releases.append((stages, skip_host))
            self._cond.notify_all()

    @property
    def num_pending(self) -> int:
        """Pulls submitted whose end the step has not taken yet."""
        with self._cond:
            return len(self._queue) + self._running + len(self._finished)

    @property
    def num_pullers(self) -> int:
        return len(self._pullers)

    def close(self, timeout_s: float | None = None) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s if timeout_s is not None else 2 * self.timeout_s + 1)
        for puller in reversed(self._pullers):  # the engine's owner last
            puller.close()

    # ---- the pulling thread ------------------------------------------------------------------
    def _next_job(self):
        """-> ("release", (stages, skip_host)), ("pull", (key, ..., puller or None)) or None
        once closed; under the lock."""
        while True:
            if self._closed:
                return None
            if self._releases:
                return "release", self._releases.popleft()
            if self._queue and (self._free or len(self._pullers) < self.max_held):
                key, stages, start, end, submitted = self._queue.popleft()
                self._running += 1
                puller = self._free.pop() if self._free else None
                return "pull", (key, stages, start, end, submitted, puller)
            self._cond.wait()

    def _new_puller(self) -> ArenaPuller:
        engine = next((p.engine for p in self._pullers if p.engine is not None), None)
        puller = ArenaPuller(self.host, self.protocol, self.timeout_s, engine=engine)
        self._pullers.append(puller)
        return puller

    def _run(self) -> None:
        while True:
            with self._cond:
                job = self._next_job()
            if job is None:
                return
            kind, args = job
            if kind == "release":
                stages, skip_host = args
                for puller in self._pullers[:1]:  # none: nothing was ever pulled
                    puller.release(stages, skip_host=skip_host)
                continue
            key, stages, start, end, submitted, puller = args
            started = time.monotonic()
            result: object
            try:
                if puller is None:
                    puller = self._new_puller()
                result = puller.pull(stages, start, end)
            except PullFailed as err:
                result = err
            except Exception as err:  # an engine that would not start, a bad location
                log.exception("KV pull %s failed", key)
                result = PullFailed(f"{type(err).__name__}: {err}")
            with self._cond:
                self._running -= 1
                if puller is not None:
                    self._held[key] = puller
                ended = time.monotonic()
                self._finished.append(PullEnd(key, result, started - submitted, ended - started))
                self._cond.notify_all()
