"""Rank 0's live requests alone (runtime/live_requests.py): a request that hands its KV on ends
when the leader finished it and every stage reported its part, in whichever order they come."""

from __future__ import annotations

from types import SimpleNamespace

from wavepp.kv_transfer.export import ExportOutcome
from wavepp.runtime.live_requests import LiveRequests
from wavepp.sched import RequestState


def done(internal_id, state=RequestState.DONE):
    return SimpleNamespace(request_id=internal_id, state=state)


def on_done(request_id, req, errors):
    return request_id, errors


def test_an_export_ends_at_the_last_report_whichever_comes_first():
    live = LiveRequests(num_stages=3)
    a, fut_a = live.add(10, exports=True)
    b, fut_b = live.add(11, exports=True)
    plain, fut_plain = live.add(None)
    live.report(ExportOutcome(a, "ta", 0), on_done)                     # before the first token
    live.finish(done(plain), on_done)
    live.finish(done(a), on_done)
    assert fut_plain.result(0) == (0, {}) and not fut_a.done()
    live.report(ExportOutcome(a, "ta", 2, "No space left on device"), on_done)
    assert not fut_a.done() and len(live) == 2
    live.report(ExportOutcome(a, "ta", 1), on_done)
    assert fut_a.result(0) == (10, {2: "No space left on device"})
    for stage in range(3):                                              # all reported, then finished
        live.report(ExportOutcome(b, "tb", stage), on_done)
    assert not fut_b.done()
    live.finish(done(b), on_done)
    assert fut_b.result(0) == (11, {})
    assert len(live) == 0 and (live.num_exports_written, live.num_exports_failed) == (5, 1)
    assert live.add(10, exports=True)[0] != a                           # the caller's id is free again


def test_a_request_that_ended_otherwise_drops_its_reports():
    live = LiveRequests(num_stages=2)
    a, fut = live.add(1, exports=True)
    live.report(ExportOutcome(a, "t", 0), on_done)
    live.finish(done(a, RequestState.ABORTED), on_done)
    assert fut.result(0) == (1, {}) and len(live) == 0
    live.report(ExportOutcome(a, "t", 1, "missing"), on_done)          # late: counted, nothing kept
    assert (live.num_exports_written, live.num_exports_failed) == (1, 1)
    assert live._exports == {} and live._held == {}


def test_a_failing_answer_fails_the_future_instead_of_leaving_it_waiting():
    live = LiveRequests(num_stages=1)
    a, fut = live.add(None, exports=True)
    live.finish(done(a), on_done)

    def broken(request_id, req, errors):
        raise RuntimeError("cannot build the answer")
    live.report(ExportOutcome(a, "t", 0), broken)
    assert isinstance(fut.exception(0), RuntimeError) and len(live) == 0


def test_a_held_answer_expires_naming_the_stages_that_never_reported():
    live = LiveRequests(num_stages=3)
    a, fut_a = live.add(1, exports=True)
    b, fut_b = live.add(2, exports=True)
    live.report(ExportOutcome(a, "ta", 0), on_done)
    live.finish(done(a), on_done, now=10.0)
    live.finish(done(b), on_done, now=12.0)
    assert live.expire_held(14.9, 5.0, on_done) == 15.0 and not fut_a.done()   # a comes due first
    assert live.expire_held(15.0, 5.0, on_done) == 17.0
    stages, why = zip(*fut_a.result(0)[1].items())
    assert fut_a.result(0)[0] == 1 and stages == (1, 2) and all("no report within 5 s" in w for w in why)
    live.report(ExportOutcome(b, "tb", 0), on_done)
    live.report(ExportOutcome(b, "tb", 1), on_done)
    live.report(ExportOutcome(b, "tb", 2, "disk full"), on_done)                # b's last report in time
    assert fut_b.result(0) == (2, {2: "disk full"})
    assert live.expire_held(100.0, 5.0, on_done) is None
    live.report(ExportOutcome(a, "ta", 1), on_done)                            # late: counted, dropped
    assert live.num_exports_written == 4 and live._exports == {} and live._held == {}
