"""The hand-off's stage reports alone (kv_transfer/reports.py, and KVHandoff's deadline on a fake
clock): a request that hands its KV on ends when the leader finished it and every stage
reported its part, in whichever order they come; a silent stage is named after the wait."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from tests.eventually import eventually
from wavepp.kv_transfer.export import ExportOutcome
from wavepp.kv_transfer.handoff import KVHandoff
from wavepp.kv_transfer.reports import ExportReports
from wavepp.runtime.live_requests import LiveRequests
from wavepp.sched import RequestState


def done(request_id, state=RequestState.DONE):
    return SimpleNamespace(request_id=request_id, state=state)


def test_an_export_ends_at_the_last_report_whichever_comes_first():
    reports = ExportReports(num_stages=3, wait_s=60)
    reports.expect(0)
    reports.expect(1)
    assert reports.report(ExportOutcome(0, "ta", 0)) is None  # before the first token
    assert not reports.finished(done(2), 0.0) and reports.take_errors(2) == {}  # never exported
    assert reports.finished(done(0), 0.0)
    assert reports.report(ExportOutcome(0, "ta", 2, "No space left on device")) is None
    req, errors = reports.report(ExportOutcome(0, "ta", 1))
    assert req.request_id == 0 and errors == {2: "No space left on device"}
    for stage in range(3):  # all reported, then finished
        assert reports.report(ExportOutcome(1, "tb", stage)) is None
    assert not reports.finished(done(1), 0.0) and reports.take_errors(1) == {}
    assert len(reports) == 0 and (reports.num_written, reports.num_failed) == (5, 1)


def test_a_request_that_ended_otherwise_drops_its_reports():
    reports = ExportReports(num_stages=2, wait_s=60)
    reports.expect(0)
    reports.report(ExportOutcome(0, "t", 0))
    assert not reports.finished(done(0, RequestState.ABORTED), 0.0)
    assert reports.take_errors(0) == {} and len(reports) == 0
    assert (
        reports.report(ExportOutcome(0, "t", 1, "missing")) is None
    )  # late: counted, nothing kept
    assert (reports.num_written, reports.num_failed) == (1, 1) and len(reports) == 0


def test_a_held_answer_expires_naming_the_stages_that_never_reported():
    reports = ExportReports(num_stages=3, wait_s=5.0)
    for r in (1, 2):
        reports.expect(r)
    reports.report(ExportOutcome(1, "ta", 0))
    assert reports.finished(done(1), 10.0) and reports.finished(done(2), 12.0)
    assert reports.expire(14.9) == ([], 15.0)  # 1 comes due first
    ((req, errors),) = reports.expire(15.0)[0]
    assert req.request_id == 1 and list(errors) == [1, 2]
    assert all("no report within 5 s" in why for why in errors.values())
    assert reports.expire(15.0) == ([], 17.0)
    reports.report(ExportOutcome(2, "tb", 0))
    reports.report(ExportOutcome(2, "tb", 1))
    req, errors = reports.report(ExportOutcome(2, "tb", 2, "disk full"))  # the last report in time
    assert req.request_id == 2 and errors == {2: "disk full"}
    assert reports.expire(100.0) == ([], None) and len(reports) == 0


def test_the_handoff_answers_at_the_deadline_on_its_own_thread(tmp_path):
    """KVHandoff on a fake clock: a held request is answered by its thread once the clock
    passes the wait, with the silent stages named; not before."""
    now = [100.0]
    handoff = KVHandoff(
        tmp_path, num_stages=2, export_wait_s=5.0, clock=lambda: now[0], sweep_interval_s=0.01
    )
    answered = []
    event = threading.Event()
    handoff.expect(7)
    assert handoff.finished(done(7))
    handoff.start(lambda req, errors: (answered.append((req.request_id, errors)), event.set()))
    try:
        assert not event.wait(0.2) and answered == []
        handoff.report(ExportOutcome(7, "t", 0))
        now[0] = 105.0
        assert event.wait(5)
        assert answered == [
            (7, {1: "no report within 5 s of the prefill's end (its KV writer is stuck or slow)"})
        ]
        assert handoff.num_in_flight() == 0 and handoff.counts() == (1, 0)
    finally:
        handoff.close()


def test_live_requests_free_the_callers_id_when_a_request_ends():
    live = LiveRequests()
    a, fut_a = live.add(10)
    b, fut_b = live.add(None)
    assert fut_a.request_id == 10 and fut_b.request_id == 0 and len(live) == 2
    live.resolve(a, lambda request_id: ("answer", request_id))
    assert fut_a.result(0) == ("answer", 10) and live.internal_id(10) is None
    live.resolve(a, lambda request_id: 1 / 0)  # ended already: nothing
    assert live.add(10)[0] not in (a, b)  # the caller's id is free again

    def broken(request_id):
        raise RuntimeError("cannot build the answer")

    live.resolve(b, broken)
    assert isinstance(fut_b.exception(0), RuntimeError)
    live.fail_all(RuntimeError("down"))
    assert len(live) == 0


def test_a_held_answer_wakes_the_thread_without_a_store_sweep(tmp_path):
    """Held answers only move the next deadline: the store is swept on its interval and when it
    has work (a new transfer, a drop), not once per finished request."""
    import time

    handoff = KVHandoff(tmp_path, num_stages=2, export_wait_s=60, sweep_interval_s=60)
    sweeps = []
    sweep = handoff.store.sweep
    handoff.store.sweep = lambda now=None: sweeps.append(now) or sweep(now)
    handoff.start()
    try:
        assert eventually(lambda: sweeps)  # the first pass
        for request_id in range(50):
            handoff.expect(request_id)
            assert handoff.finished(done(request_id))
        time.sleep(0.3)
        assert len(sweeps) == 1
        handoff.open([1, 2], True, {"num_stages": 2})
        assert eventually(lambda: len(sweeps) >= 2) and len(sweeps) == 2
    finally:
        handoff.close()
