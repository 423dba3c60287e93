"""Where a request's time went (bench/tail.py): its five phases add up to its TTFT and answer,
the quantile picks the request there, and the trace puts each phase on that request's track
after the one before, on the stages' clock."""

import pytest

from wavepp.bench.tail import PHASES, at_quantile, breakdown, markdown, phases, trace_events


def record(arrival, queue, admitted, dispatched, ttft, answer=0.002, tokens=576, cached=512):
    return {
        "arrival_unix_s": arrival,
        "queue_s": queue,
        "admission_s": admitted,
        "dispatch_s": dispatched,
        "ttft_s": ttft,
        "answer_s": answer,
        "prompt_tokens": tokens,
        "cached_tokens": cached,
        "priority": 0,
    }


def test_phases_add_up_to_the_ttft_and_the_answer():
    r = record(100.0, 0.010, 0.013, 0.050, 0.200)
    p = phases(r)
    assert list(p) == list(PHASES)
    assert p["queue"] == 0.010 and p["round"] == pytest.approx(0.003)
    assert p["wave"] == pytest.approx(0.037) and p["waves"] == pytest.approx(0.150)
    assert sum(p.values()) == pytest.approx(r["ttft_s"] + r["answer_s"])


def test_the_quantile_picks_the_request_there():
    records = [record(100.0 + i, 0.0, 0.001, 0.002, 0.01 * (i + 1)) for i in range(100)]
    records.append({"ttft_s": None})  # failed: not served, not counted
    assert at_quantile(records, 0.5)["ttft_s"] == pytest.approx(0.50)
    assert at_quantile(records, 0.99)["ttft_s"] == pytest.approx(0.99)
    rows = breakdown(records)
    assert [r["quantile"] for r in rows] == [0.5, 0.99]
    table = markdown(rows)
    assert "| p99 | 990 |" in table and "| p50 | 500 |" in table
    with pytest.raises(ValueError, match="no served request"):
        at_quantile([{"ttft_s": None}], 0.5)


def test_trace_tracks_follow_each_other_on_one_clock():
    waves = [[0, 0, 100.00, 100.05], [1, 0, 100.06, 100.11]]
    rounds = [[0, 99.99, 100.0]]
    slow = record(99.98, 0.01, 0.02, 0.02, 0.13)
    events = trace_events([("p99 request", slow)], waves, rounds)
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {"stage 0", "stage 1", "admission rounds", "p99 request"}
    spans = [e for e in events if e["ph"] == "X"]
    mine = [e for e in spans if e["tid"] == 3]
    assert [e["name"] for e in mine] == list(PHASES)
    assert mine[0]["ts"] == 0.0  # the request arrived first: the clock starts there
    for a, b in zip(mine, mine[1:]):
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
    wave0 = next(e for e in spans if e["name"] == "wave 0" and e["tid"] == 0)
    assert wave0["ts"] == pytest.approx(1e6 * 0.02)
