"""Which stages have reported their part of each hand-off, and when an answer stops waiting.

A request that hands its KV on ends when the leader finished it and every stage reported its
part (export.py: written, or failed and why): its answer waits for the last report, so it says
whether the hand-off is whole. Reports of a request that ended otherwise (failed, aborted) are
counted and dropped. A writer that never reports (stuck on its file system) does not hold the
answer for ever: `expire` releases it `wait_s` after the prefill ended, the stages that did not
report named failed; their later reports are counted and dropped.

    reports.expect(request_id)               the request exports (at submit)
    reports.finished(req, now) -> bool       the leader finished it: True while it must wait
    reports.report(outcome) -> (req, errors) | None   a stage's outcome; the request it completes
    reports.expire(now) -> ([(req, errors)], next due | None)
    reports.take_errors(request_id)          {stage: why} of its failed parts; forgets it

Pure: no lock, no thread, no clock of its own (the caller passes `now`, any monotonic clock in
seconds); `KVHandoff` (handoff.py) holds it under its lock and runs the deadline. Entries live
from `expect` to the request's end: bounded by the requests in flight.
"""

from __future__ import annotations

import math

from wavepp.sched import RequestState


class ExportReports:
    def __init__(self, num_stages: int, wait_s: float):
        self.num_stages = num_stages
        self.wait_s = wait_s
        self._reports: dict[int, dict[int, str | None]] = {}  # request id -> {stage: error or None}
        self._held: dict[int, tuple[object, float]] = {}  # finished (when), waiting for reports
        self.num_written = 0  # parts, every report since start
        self.num_failed = 0

    def __len__(self) -> int:
        return len(self._reports)

    def expect(self, request_id: int) -> None:
        self._reports[request_id] = {}

    def finished(self, req, now: float) -> bool:
        """The leader finished `req` at `now`: True if it is held until its stages report (a
        done request that exports, some stage not heard from yet); else its answer comes now
        (`take_errors`)."""
        reports = self._reports.get(req.request_id)
        if (
            reports is not None
            and req.state == RequestState.DONE
            and len(reports) < self.num_stages
        ):
            self._held[req.request_id] = (req, now)
            return True
        return False

    def report(self, outcome) -> tuple[object, dict[int, str]] | None:
        """A stage's outcome of one part (ExportOutcome): counted; where it was the last one a
        held request waited for, that request and its errors (it is forgotten)."""
        if outcome.error is None:
            self.num_written += 1
        else:
            self.num_failed += 1
        reports = self._reports.get(outcome.request_id)
        if reports is None:  # it ended already (failed, aborted, expired) or never exported
            return None
        reports[outcome.stage_id] = outcome.error
        held = self._held.get(outcome.request_id)
        if held is None or len(reports) < self.num_stages:
            return None
        return held[0], self.take_errors(outcome.request_id)

    def expire(self, now: float) -> tuple[list[tuple[object, dict[int, str]]], float | None]:
        """Every held request that finished `wait_s` or more before `now`, with its errors (each
        stage that did not report named failed), forgotten; and when the next comes due (the
        same clock), or None when none is held."""
        due, out = math.inf, []
        for request_id, (req, since) in list(self._held.items()):
            if now - since < self.wait_s:
                due = min(due, since + self.wait_s)
                continue
            reports = self._reports[request_id]
            for stage in range(self.num_stages):
                reports.setdefault(
                    stage,
                    f"no report within {self.wait_s:g} s of the prefill's end "
                    f"(its KV writer is stuck or slow)",
                )
            out.append((req, self.take_errors(request_id)))
        return out, None if due == math.inf else due

    def take_errors(self, request_id: int) -> dict[int, str]:
        """{stage: why} of the request's parts that failed, by stage; the request is forgotten."""
        reports = self._reports.pop(request_id, None) or {}
        self._held.pop(request_id, None)
        return {stage: error for stage, error in sorted(reports.items()) if error is not None}

    def clear(self) -> None:
        self._reports.clear()
        self._held.clear()
