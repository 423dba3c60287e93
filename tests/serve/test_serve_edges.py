"""`wavepp serve` at the edges, over real HTTP on loopback: 429 under overload, a client
disconnect aborts its request (leases and escrow go back), a killed stage turns /health and
every request into 503 naming it, and SIGTERM leaves no stage process behind."""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import threading
import time

import httpx
import pytest

from tests.serve.conftest import VOCAB, ServerProcess, alive, hf_logprobs

pytestmark = pytest.mark.slow
FP32_ATOL = 1e-4


@pytest.fixture(scope="module")
def edge_server(tiny_model):
    srv = ServerProcess(tiny_model, "--max-waiting", "4")
    yield srv
    srv.stop()


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(n)]


def assert_clean(server) -> None:
    r = httpx.get(f"{server.url}/debug/integrity", timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    for stage in data["stages"]:
        assert stage["num_live_requests"] == 0, data
        assert stage["num_leased"] == stage["num_escrowed"] == stage["num_in_use"] == 0, data
    assert data["leader_state_size"] == 0, data


def metric(server, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


def aborted_after_disconnect(
    server,
    aborted: str,
    ok: str,
    before_aborted: float,
    before_ok: float,
    num_prompts: int,
    timeout_s: float,
    what: str,
) -> bool:
    """After a client left: wait until the server counts an abort (True) or all `num_prompts`
    finished (False); neither within timeout_s fails the test."""
    deadline = time.monotonic() + timeout_s
    while (
        metric(server, aborted) == before_aborted and metric(server, ok) < before_ok + num_prompts
    ):
        assert time.monotonic() < deadline, f"the disconnected {what} neither aborted nor finished"
        time.sleep(0.1)
    return metric(server, aborted) > before_aborted


def test_overload_gets_429_with_retry_after(edge_server, tiny_model):
    prompts = _prompts(48, 300, seed=1)

    async def main():
        async with httpx.AsyncClient(base_url=edge_server.url, timeout=120) as client:
            return await asyncio.gather(
                *(
                    client.post("/v1/completions", json={"prompt": p, "logprobs": 1})
                    for p in prompts
                )
            )

    responses = asyncio.run(main())
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429} and codes.count(429) > 0 and codes.count(200) > 0, codes
    for r in responses:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
    served = [(p, r) for p, r in zip(prompts, responses) if r.status_code == 200]
    for p, r in served[:3]:
        lp = r.json()["choices"][0]["logprobs"]["token_logprobs"][0]
        assert math.isclose(lp, float(hf_logprobs(tiny_model, p)[-1].max()), abs_tol=FP32_ATOL)
    assert metric(edge_server, 'wavepp_requests_total{outcome="rejected"}') == codes.count(429)
    assert_clean(edge_server)


def test_client_disconnect_aborts(edge_server):
    aborted = 'wavepp_requests_total{outcome="aborted"}'
    ok = 'wavepp_requests_total{outcome="ok"}'
    # the client gives up after a few ms; on a fast machine the request may finish before that
    # (nothing to disconnect from) or before the server sees the disconnect (then it counts as
    # ok), so try fresh prompts, giving up sooner each time, until one is aborted
    outcomes = []
    for attempt, timeout_s in enumerate([0.05, 0.03, 0.02, 0.01, 0.005] * 2):
        before_aborted, before_ok = metric(edge_server, aborted), metric(edge_server, ok)
        body = {"prompt": _prompts(4, 480, seed=100 + attempt)}
        try:
            httpx.post(f"{edge_server.url}/v1/completions", json=body, timeout=timeout_s)
            outcomes.append(f"answered within {timeout_s} s")
            continue  # finished in time: nothing to disconnect from
        except httpx.TimeoutException:
            pass
        if aborted_after_disconnect(
            edge_server, aborted, ok, before_aborted, before_ok, 4, 20, "request"
        ):
            break
        outcomes.append(f"finished after the client left at {timeout_s} s")
    else:
        pytest.fail(
            f"no request was still running when its client disconnected, in 10 tries: {outcomes}"
        )
    assert_clean(edge_server)
    assert (
        httpx.post(
            f"{edge_server.url}/v1/completions", json={"prompt": [1, 2, 3]}, timeout=60
        ).status_code
        == 200
    )


def test_killed_stage_is_503_naming_it(edge_server):
    # a request in flight when the stage dies, and requests after it: all 503, none hangs
    inflight = {}

    def long_request():
        inflight["r"] = httpx.post(
            f"{edge_server.url}/v1/completions", json={"prompt": _prompts(4, 480, 3)}, timeout=60
        )

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.05)
    os.kill(edge_server.stage_pids[0], signal.SIGKILL)
    t.join(60)
    assert not t.is_alive()
    assert inflight["r"].status_code in (200, 503)  # it may have finished just before the kill
    deadline = time.monotonic() + 10
    while (health := httpx.get(f"{edge_server.url}/health", timeout=10)).status_code == 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert health.status_code == 503 and "stage 1" in health.json()["error"]["message"]
    r = httpx.post(f"{edge_server.url}/v1/completions", json={"prompt": [1, 2, 3]}, timeout=30)
    assert r.status_code == 503 and "stage 1" in r.json()["error"]["message"], r.text
    assert metric(edge_server, "wavepp_up") == 0
    assert edge_server.stop() == 0


def test_sigterm_with_requests_in_flight_leaves_no_stage(tiny_model):
    srv = ServerProcess(tiny_model, "--drain-s", "0.5")
    pids = srv.stage_pids
    assert pids and all(alive(p) for p in pids)
    done = []

    def request():
        try:
            done.append(
                httpx.post(
                    f"{srv.url}/v1/completions", json={"prompt": _prompts(8, 480, 4)}, timeout=60
                ).status_code
            )
        except httpx.HTTPError as exc:
            done.append(type(exc).__name__)

    threads = [threading.Thread(target=request) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    assert srv.stop(timeout_s=30) == 0
    assert time.monotonic() - t0 < 30
    for t in threads:
        t.join(30)
    assert len(done) == 4
    time.sleep(0.2)
    assert not any(alive(p) for p in pids)
