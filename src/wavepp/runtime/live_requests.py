"""The requests of rank 0 that have not ended: the caller's ids and their futures.

Callers name requests (any int, or an automatic one); the leader and the stages see an
internal id that is never reused, so a caller's id is free again as soon as its request ended,
whatever of it is still being released on the stages.

    caller's id --(ids)--> internal id --(futures)--> (caller's id, Future)

A request that hands its KV on (an export id) ends when the leader finished it and every stage
reported its part (kv_transfer/export.py: written, or failed and why): its future waits for
the last report, so the answer says whether the hand-off is whole. Reports of a request that
ended otherwise (failed, aborted) are counted and dropped. A writer that never reports (stuck
on its file system) does not hold the answer for ever: `expire_held` answers it after a wait,
the stages that did not report named failed; their later reports are counted and dropped.

Not thread-safe: the engine core calls it under its lock (`answer_overdue` takes it itself).
"""

from __future__ import annotations

import itertools
import math
from concurrent.futures import Future
from typing import Callable

from wavepp.sched import RequestState


class LiveRequests:
    def __init__(self, num_stages: int = 1):
        self.num_stages = num_stages
        self._ids: dict[int, int] = {}                       # caller's id -> internal id
        self._futures: dict[int, tuple[int, Future]] = {}    # internal id -> (caller's id, future)
        self._internal_ids = itertools.count()
        self._auto_ids = itertools.count()
        self._exports: dict[int, dict[int, str | None]] = {}  # internal id -> {stage: error or None}
        self._held: dict[int, tuple[object, float]] = {}     # finished (when), waiting for export reports
        self.num_exports_written = 0                          # parts, every report since start
        self.num_exports_failed = 0

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, request_id: int | None, *, exports: bool = False) -> tuple[int, Future]:
        """A new live request under the caller's id (None: the next automatic id not in use):
        its internal id and its future, whose `request_id` attribute is the caller's id. An id
        in use by a live request raises ValueError and adds nothing. `exports`: every stage
        writes its KV, and the request ends once each reported (`finish`, `report`)."""
        if request_id is None:
            request_id = next(i for i in self._auto_ids if i not in self._ids)
        elif request_id in self._ids:
            raise ValueError(f"request id {request_id} is already in use by a request that "
                             f"has not finished")
        internal_id = next(self._internal_ids)
        fut: Future = Future()
        fut.request_id = request_id      # for abort(), whichever id it got
        self._ids[request_id] = internal_id
        self._futures[internal_id] = (request_id, fut)
        if exports:
            self._exports[internal_id] = {}
        return internal_id, fut

    def internal_id(self, request_id: int) -> int | None:
        """The internal id of the caller's live request, or None (unknown or ended)."""
        return self._ids.get(request_id)

    def remove(self, internal_id: int) -> tuple[int, Future]:
        """The request ended: (its caller's id, its future); the caller's id is free again."""
        request_id, fut = self._futures.pop(internal_id)
        del self._ids[request_id]
        self._exports.pop(internal_id, None)
        self._held.pop(internal_id, None)
        return request_id, fut

    def finish(self, req, on_done: Callable, now: float = 0.0) -> None:
        """The leader finished `req` at `now` (seconds, the caller's clock): resolve its future
        with on_done(caller's id, req, {stage: why} of its KV parts that failed), now, or for a
        done request whose stages still write its KV, at the last report (or `expire_held`)."""
        reports = self._exports.get(req.request_id)
        if reports is not None and req.state == RequestState.DONE and len(reports) < self.num_stages:
            self._held[req.request_id] = (req, now)
            return
        self._resolve(req, on_done)

    def report(self, outcome, on_done: Callable) -> None:
        """A stage's outcome of one part (ExportOutcome): counted; the request it completes ends."""
        if outcome.error is None:
            self.num_exports_written += 1
        else:
            self.num_exports_failed += 1
        reports = self._exports.get(outcome.request_id)
        if reports is None:        # it ended already (failed, aborted) or never exported
            return
        reports[outcome.stage_id] = outcome.error
        held = self._held.get(outcome.request_id)
        if held is not None and len(reports) >= self.num_stages:
            self._resolve(held[0], on_done)

    def expire_held(self, now: float, wait_s: float, on_done: Callable) -> float | None:
        """Resolve every request that finished `wait_s` or more before `now` and still waits for
        stage reports, each stage that did not report named failed. Returns when the next held
        request comes due (same clock), or None when none is held."""
        due = math.inf
        for internal_id, (req, since) in list(self._held.items()):
            if now - since < wait_s:
                due = min(due, since + wait_s)
                continue
            reports = self._exports[internal_id]
            for stage in range(self.num_stages):
                reports.setdefault(stage, f"no report within {wait_s:g} s of the prefill's end "
                                          f"(its KV writer is stuck or slow)")
            self._resolve(req, on_done)
        return None if due == math.inf else due

    def answer_overdue(self, cond, now: Callable[[], float], wait_s: float, on_done: Callable,
                       stopping: Callable[[], bool]) -> None:
        """A thread's loop (the one method that takes the core's lock, `cond`, itself): answer
        what `expire_held` finds overdue, waking at the next due time, until `stopping()`."""
        with cond:
            while not stopping():
                due = self.expire_held(now(), wait_s, on_done)
                cond.wait(wait_s if due is None else min(wait_s, max(0.0, due - now()) + 1e-3))

    def remove_all(self) -> list[Future]:
        """Every live request's future; none is live afterwards."""
        out = [fut for _, fut in self._futures.values()]
        self._futures.clear()
        self._ids.clear()
        self._exports.clear()
        self._held.clear()
        return out

    def _resolve(self, req, on_done: Callable) -> None:
        reports = self._exports.get(req.request_id) or {}
        errors = {stage: error for stage, error in sorted(reports.items()) if error is not None}
        request_id, fut = self.remove(req.request_id)
        if fut.done():
            return
        try:
            value = on_done(request_id, req, errors)
        except Exception as exc:   # noqa: BLE001 - the caller hears of it instead of waiting forever
            fut.set_exception(exc)
            return
        fut.set_result(value)
