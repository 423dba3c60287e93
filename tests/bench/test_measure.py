"""run_closed_loop against a stand-in engine: failed requests end the run with their reason
instead of a throughput of the rest."""

from concurrent.futures import Future

import pytest

from wavepp.bench.measure import BenchError, run_closed_loop
from wavepp.engine import PrefillResult
from wavepp.workloads.synthetic import short_suffix


class FakeEngine:
    """Answers every request at once; the requests whose index is in `fail` fail (with an
    error result, or, for `raise_at`, with an exception on the future)."""

    def __init__(self, fail=(), raise_at=()):
        self.fail, self.raise_at, self.count = set(fail), set(raise_at), 0

    def submit(self, token_ids, **_):
        i, self.count = self.count, self.count + 1
        fut = Future()
        if i in self.raise_at:
            fut.set_exception(RuntimeError(f"stage 1 died at request {i}"))
            return fut
        error = f"request {i}: the stage failed" if i in self.fail else None
        fut.set_result(
            PrefillResult(
                i,
                len(token_ids),
                0,
                None if error else 7,
                None if error else -0.1,
                (),
                0.01,
                0.0,
                error=error,
            )
        )
        return fut


def workload():
    return short_suffix(num_requests=8, num_groups=2, prefix_len=32, suffix_len=16, vocab_size=100)


def test_a_failed_request_ends_the_run_with_its_reason():
    with pytest.raises(
        BenchError, match=r"2 of 8 requests failed; the first: request 3: the stage failed"
    ):
        run_closed_loop(FakeEngine(fail={3, 5}), workload(), 4, policy_label="wavepp")


def test_an_exception_on_a_future_ends_it_too():
    with pytest.raises(
        BenchError, match=r"1 of 8 requests failed; the first: RuntimeError: stage 1 died"
    ):
        run_closed_loop(FakeEngine(raise_at={6}), workload(), 4, policy_label="wavepp")


def test_all_answered_gives_the_summary(monkeypatch):
    import wavepp.bench.measure as measure

    monkeypatch.setattr(measure, "summarize", lambda engine, wl, results, *a: results)
    results = run_closed_loop(FakeEngine(), workload(), 4, policy_label="wavepp")
    assert [r.request_id for r in results] == list(range(8)) and all(r.ok for r in results)


def test_hit_rate_by_tier_over_http_from_the_metrics_deltas():
    """`wavepp bench --url` splits the hit rate by tier from the server's
    wavepp_kv_tier_hit_blocks_total deltas: a lower tier's share is its largest over the
    stages, the pool has the rest; a server without the family gives None."""
    from wavepp.bench.http import ServerInfo, _tier_hit_rates

    info = ServerInfo("http://x", "m", 2, "wavepp", "bfloat16", 16, 256, False)
    name = "wavepp_kv_tier_hit_blocks_total"
    delta = {
        (name, (("stage", "0"), ("tier", "host"))): 4.0,
        (name, (("stage", "1"), ("tier", "host"))): 6.0,
        (name, (("stage", "0"), ("tier", "store"))): 10.0,
        (name, (("stage", "1"), ("tier", "store"))): 8.0,
    }
    rates = _tier_hit_rates(delta, info, 1000, 600)
    assert rates == {"pool": 0.6 - 0.096 - 0.16, "host": 0.096, "store": 0.16}
    assert _tier_hit_rates({}, info, 1000, 600) is None
