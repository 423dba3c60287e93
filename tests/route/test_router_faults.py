"""`wavepp route` under faults and hostile input, against stand-in upstreams (httpx.MockTransport):
no state shared between clients, end-to-end headers through and hop-by-hop ones dropped, no
internal address in an error, no client-named transfer reaching the decode side, and a transfer
given up (the prefill told to drop it) when the decode side fails."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wavepp.route.config import RouteConfig
from wavepp.route.router import RequestRouter

PREFILL, DECODE = "http://prefill.internal:8000", "http://decode.internal:8001"
PARAMS = {"transfer_id": "wpp-1", "num_tokens": 5, "num_stages": 2, "block_size": 16}


class Upstreams:
    """Stand-in prefill and decode servers: each request is recorded (method, path, headers,
    body); `answer[side]` makes the answer (default: a normal one)."""

    def __init__(self):
        self.seen: list[tuple[str, str, str, httpx.Headers, dict | None]] = []
        self.answer = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        side = "prefill" if request.url.host.startswith("prefill") else "decode"
        body = json.loads(request.content) if request.content else None
        self.seen.append((side, request.method, request.url.path, request.headers, body))
        if side in self.answer:
            return self.answer[side](request)
        if side == "prefill":
            return httpx.Response(
                200, json={"choices": [{"text": "x"}], "kv_transfer_params": PARAMS}
            )
        return httpx.Response(200, json={"choices": [{"text": "decoded"}]})

    def sent(self, side: str, method: str = "POST"):
        return [s for s in self.seen if s[0] == side and s[1] == method]


def route(upstreams: Upstreams, **config) -> TestClient:
    app = RequestRouter(
        RouteConfig(PREFILL, DECODE, **config), transport=httpx.MockTransport(upstreams)
    ).app
    return TestClient(app)


def test_a_cookie_one_client_is_sent_never_reaches_another():
    up = Upstreams()
    up.answer["decode"] = lambda r: httpx.Response(
        200, json={"choices": [{"text": "d"}]}, headers={"set-cookie": "session=alice; Path=/"}
    )
    alice = route(up)
    first = alice.post("/v1/completions", json={"prompt": "a"})
    assert first.status_code == 200 and first.headers["set-cookie"].startswith("session=alice")
    bob = TestClient(alice.app)  # another client, the same router
    assert bob.post("/v1/completions", json={"prompt": "b"}).status_code == 200
    bobs = [s for s in up.seen[2:]]
    assert bobs and all("cookie" not in headers for _, _, _, headers, _ in bobs)
    alice.post("/v1/completions", json={"prompt": "a"})  # alice's own cookie goes with hers
    assert all(headers.get("cookie") == "session=alice" for _, _, _, headers, _ in up.seen[4:])


def test_end_to_end_headers_pass_both_ways_and_hop_by_hop_ones_do_not():
    up = Upstreams()
    up.answer["prefill"] = lambda r: httpx.Response(
        429,
        json={"error": {"message": "busy"}},
        headers={
            "retry-after": "7",
            "x-upstream": "p",
            "connection": "x-secret",
            "x-secret": "1",
            "keep-alive": "timeout=5",
        },
    )
    client = route(up)
    resp = client.post(
        "/v1/completions",
        json={"prompt": "a"},
        headers={
            "x-request-id": "r-1",
            "authorization": "Bearer k",
            "connection": "keep-alive, x-hop",
            "x-hop": "1",
            "te": "trailers",
        },
    )
    assert resp.status_code == 429 and resp.json()["error"]["message"] == "busy"
    assert resp.headers["retry-after"] == "7" and resp.headers["x-upstream"] == "p"
    assert "x-secret" not in resp.headers and "keep-alive" not in resp.headers
    ((_, _, _, sent, _),) = up.sent("prefill")
    assert sent["x-request-id"] == "r-1" and sent["authorization"] == "Bearer k"
    assert "x-hop" not in sent and "te" not in sent and sent["content-type"] == "application/json"
    assert not up.sent("decode")
    up.answer.pop("prefill")
    up.answer["decode"] = lambda r: httpx.Response(
        503, json={"error": {"message": "down"}}, headers={"retry-after": "3"}
    )
    resp = client.post("/v1/completions", json={"prompt": "a"}, headers={"x-request-id": "r-2"})
    assert resp.status_code == 503 and resp.headers["retry-after"] == "3"
    assert up.sent("decode")[-1][3]["x-request-id"] == "r-2"


@pytest.mark.parametrize("answer", [b"[1, 2]", b'"text"', b"not json", b"null"])
def test_a_prefill_200_that_is_not_an_object_is_a_502(answer):
    up = Upstreams()
    up.answer["prefill"] = lambda r: httpx.Response(200, content=answer)
    resp = route(up).post("/v1/completions", json={"prompt": "a"})
    assert resp.status_code == 502 and "not a JSON object" in resp.json()["error"]["message"]
    assert not up.sent("decode")


@pytest.mark.parametrize("error, status", [(httpx.ConnectError, 502), (httpx.ReadTimeout, 504)])
@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_an_upstream_that_fails_is_502_or_504_naming_no_address(error, status, side):
    up = Upstreams()

    def fail(request):
        raise error(f"failed talking to {request.url}", request=request)

    up.answer[side] = fail
    resp = route(up, timeout_s=2).post("/v1/completions", json={"prompt": "a"})
    message = resp.json()["error"]["message"]
    assert resp.status_code == status and f"the {side} server" in message
    assert "internal" not in message and "800" not in message, message


def test_a_client_never_names_the_transfer_the_decode_side_loads():
    up = Upstreams()
    up.answer["prefill"] = lambda r: httpx.Response(
        200, json={"choices": [{"text": "x"}]}
    )  # no hand-off
    client = route(up)
    victim = {"transfer_id": "someone-elses", "num_tokens": 5}
    assert (
        client.post(
            "/v1/completions", json={"prompt": "a", "kv_transfer_params": victim}
        ).status_code
        == 200
    )
    assert "kv_transfer_params" not in up.sent("decode")[-1][4]
    up.answer.pop("prefill")  # with a hand-off: the prefill's params, not the client's
    client.post("/v1/completions", json={"prompt": "a", "kv_transfer_params": victim})
    assert up.sent("decode")[-1][4]["kv_transfer_params"] == PARAMS
    assert all(s[4]["kv_transfer_params"] == {"do_remote_decode": True} for s in up.sent("prefill"))


@pytest.mark.parametrize("stream", [False, True])
def test_a_decode_that_fails_has_the_prefill_drop_the_transfer(stream):
    up = Upstreams()
    up.answer["decode"] = lambda r: httpx.Response(500, json={"error": {"message": "oom"}})
    client = route(up)
    resp = client.post("/v1/completions", json={"prompt": "a", "stream": stream})
    assert resp.status_code == 500 and resp.json()["error"]["message"] == "oom"
    drops = up.sent("prefill", "DELETE")
    assert [path for _, _, path, _, _ in drops] == ["/v1/kv_transfers/wpp-1"]

    def down(request):
        raise httpx.ConnectError("refused", request=request)

    up.answer["decode"] = down
    assert client.post("/v1/completions", json={"prompt": "a", "stream": stream}).status_code == 502
    assert len(up.sent("prefill", "DELETE")) == 2
    up.answer.pop("decode")  # a decode that answers: its connector frees the transfer
    assert client.post("/v1/completions", json={"prompt": "a"}).status_code == 200
    assert len(up.sent("prefill", "DELETE")) == 2


def test_a_body_past_the_limit_is_413_and_reaches_no_upstream():
    up = Upstreams()
    resp = route(up, max_body_bytes=1000).post("/v1/completions", json={"prompt": "a" * 2000})
    assert resp.status_code == 413 and "--max-body-bytes" in resp.json()["error"]["message"]
    assert not up.seen


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["prompt", "messages", "stream", "kv_transfer_params", "max_tokens", "x"]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=JSON, path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_no_body_gets_a_5xx_from_the_router(body, path):
    """Upstreams that answer normally: whatever the client sends, the router answers 2xx or 4xx.
    (Numbers past Python's int limit: tests/serve/test_serve_fuzz.py's Raw, at the router too.)"""
    up = Upstreams()
    client = route(up)
    resp = client.post(
        path, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    assert resp.status_code < 500, (resp.status_code, resp.text[:200])
    huge = client.post(path, content=b'{"prompt": ' + b"9" * 5000 + b"}")
    assert huge.status_code == 400


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_numbers_json_has_not_are_a_400(number):
    """Python's parser takes NaN and Infinity (1e999 becomes inf); JSON has neither, and the
    body could not be sent on (it was a 500)."""
    up = Upstreams()
    resp = route(up).post(
        "/v1/completions", content=b'{"prompt": "a", "temperature": ' + number + b"}"
    )
    assert resp.status_code == 400, resp.text
    assert not up.seen


def test_each_upstream_wait_takes_its_own_option():
    """--health-timeout-s, --query-timeout-s, --drop-timeout-s and --timeout-s each bound
    their own calls: a stand-in that answers after 0.5 s fails a call allowed less."""
    up, waits = Upstreams(), {}
    normal = up.__call__

    def slow(request: httpx.Request) -> httpx.Response:
        read = request.extensions["timeout"]["read"]
        waits.setdefault(request.url.path, set()).add(read)
        if read < 0.5:
            raise httpx.ReadTimeout("no answer", request=request)
        if request.url.path == "/v1/cache_query":
            return httpx.Response(200, json={"cached_tokens": 0, "num_tokens": 1})
        return normal(request)

    up.answer["decode"] = lambda r: httpx.Response(500, json={"error": {"message": "x"}})
    config = RouteConfig(
        f"{PREFILL},http://prefill2.internal:8000",
        DECODE,
        timeout_s=7.0,
        health_timeout_s=0.25,
        query_timeout_s=0.75,
        drop_timeout_s=3.0,
    )
    router = RequestRouter(config, transport=httpx.MockTransport(slow))
    with TestClient(router.app) as client:
        assert client.get("/health").status_code == 503  # 0.25 s < 0.5 s: every server down
        assert waits["/health"] == {0.25}
        for table in (router.prefills, router.decodes):
            for i in range(len(table.replicas)):
                table.set_healthy(i, True)
        assert client.post("/v1/completions", json={"prompt": "a"}).status_code == 500
    assert waits["/v1/cache_query"] == {0.75}
    assert waits["/v1/completions"] == {7.0}
    assert waits["/v1/kv_transfers/wpp-1"] == {3.0}
    with pytest.raises(ValueError, match="drop_timeout_s"):
        RouteConfig(PREFILL, DECODE, drop_timeout_s=0)


def test_a_stale_health_check_does_not_take_a_server_back_out():
    """A check sent while a link was down answers after a newer check found the server back
    (the periodic checks and GET /health run side by side): the newer answer stands."""
    import asyncio

    gate = asyncio.Event()
    answers = iter([503, 200])  # the first check sent finds it down, the second up

    async def upstream(request: httpx.Request) -> httpx.Response:
        status = next(answers)
        if status == 503:
            await gate.wait()  # the old check: still waiting on the dead link
        return httpx.Response(status)

    router = RequestRouter(RouteConfig(PREFILL), transport=httpx.MockTransport(upstream))

    async def scenario():
        old = asyncio.create_task(router.check_health())
        await asyncio.sleep(0.01)
        await router.check_health()  # the newer check: the server is up
        assert router.prefills.healthy() == [0]
        gate.set()
        await old  # its answer comes last, and is older
        return router.prefills.healthy()

    assert asyncio.run(scenario()) == [0]
