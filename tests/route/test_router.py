"""`wavepp route` against stand-in upstreams (httpx.MockTransport): what each side is sent, what
the client gets back, errors and streams passed through, bad bodies refused."""

from __future__ import annotations

import json

import httpx
from fastapi.testclient import TestClient

from wavepp.route.config import RouteConfig
from wavepp.route.router import RequestRouter
from wavepp.route.upstream import prefill_body
from wavepp.serve.chat import parse_chat
from wavepp.serve.completion_request import parse_completion

PREFILL, DECODE = "http://prefill", "http://decode"
PARAMS = {"transfer_id": "wpp-1", "num_tokens": 5, "num_stages": 2, "block_size": 16}


def router(prefill_status=200, decode_status=200, prefill_params=PARAMS, stream_chunks=None):
    seen = {"prefill": [], "decode": []}

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        if request.url.host == "prefill":
            seen["prefill"].append((request.url.path, body))
            if prefill_status != 200:
                return httpx.Response(
                    prefill_status, json={"error": {"message": "prefill says no"}}
                )
            return httpx.Response(
                200, json={"choices": [{"text": "x"}], "kv_transfer_params": prefill_params}
            )
        seen["decode"].append((request.url.path, body))
        if decode_status != 200:
            return httpx.Response(decode_status, json={"error": {"message": "decode says no"}})
        if body.get("stream"):
            return httpx.Response(
                200, content=b"".join(stream_chunks), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(
            200,
            json={
                "choices": [{"text": "decoded"}],
                "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}},
            },
        )

    app = RequestRouter(RouteConfig(PREFILL, DECODE), transport=httpx.MockTransport(handle)).app
    return TestClient(app), seen


def test_prefill_then_decode_with_the_returned_params():
    client, seen = router()
    body = {"model": "m", "prompt": "hello", "max_tokens": 16, "temperature": 0}
    resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "decoded"
    path, sent = seen["prefill"][0]
    assert path == "/v1/completions" and sent["max_tokens"] == 1 and sent["stream"] is False
    assert sent["kv_transfer_params"] == {"do_remote_decode": True} and sent["prompt"] == "hello"
    path, sent = seen["decode"][0]
    assert sent == {**body, "kv_transfer_params": PARAMS}


def test_chat_and_streams_pass_through():
    chunks = [b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n', b"data: [DONE]\n\n"]
    client, seen = router(stream_chunks=chunks)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 9,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        got = b"".join(resp.iter_raw())
    assert got == b"".join(chunks)
    _, sent = seen["prefill"][0]
    assert (
        "stream_options" not in sent
        and "max_completion_tokens" not in sent
        and sent["max_tokens"] == 1
    )
    assert seen["decode"][0][1]["stream_options"] == {"include_usage": True}


def test_errors_keep_their_status_and_body():
    client, seen = router(prefill_status=400)
    resp = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
    assert (
        resp.status_code == 400
        and resp.json()["error"]["message"] == "prefill says no"
        and not seen["decode"]
    )
    client, _ = router(decode_status=503)
    resp = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
    assert resp.status_code == 503 and resp.json()["error"]["message"] == "decode says no"


def test_without_kv_params_the_decode_side_computes():
    client, seen = router(prefill_params=None)
    assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    assert "kv_transfer_params" not in seen["decode"][0][1]


def test_bad_bodies_are_400():
    client, seen = router()
    for raw in (b"{not json", b"[1, 2]", b"[" * 5000 + b"]" * 5000, b"\xff\xfe"):
        resp = client.post(
            "/v1/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert resp.status_code == 400, raw[:20]
    assert not seen["prefill"]


def test_an_upstream_that_is_down_is_a_502():
    def down(request):
        raise httpx.ConnectError("refused", request=request)

    client = TestClient(
        RequestRouter(RouteConfig(PREFILL, DECODE), transport=httpx.MockTransport(down)).app
    )
    resp = client.post("/v1/completions", json={"prompt": "x"})
    assert resp.status_code == 502 and "prefill server" in resp.json()["error"]["message"]


def test_the_prefill_body_is_one_wavepp_serve_accepts():
    """A client's sampling is the decode side's: the router sends the prefill none of it, so
    `wavepp serve` (which refuses sampling that could change its greedy token) takes the body."""
    sampling = {
        "temperature": 0.7,
        "top_p": 0.9,
        "n": 2,
        "repetition_penalty": 1.1,
        "seed": 3,
        "logit_bias": {"5": 2},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    completion = prefill_body({"model": "m", "prompt": "hello", "max_tokens": 64, **sampling})
    chat = prefill_body(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 64,
            **sampling,
        }
    )
    assert parse_completion(completion, ("m",), 20).max_tokens == 1
    assert parse_chat(chat, ("m",), 20).max_tokens == 1
    for sent in (completion, chat):
        assert not set(sampling) & set(sent) - {"stream"} and sent["stream"] is False


def test_a_failed_hand_off_still_decodes_and_the_decode_side_hears_why():
    """The prefill's params name a failed part: forwarded as they are (the connector refuses
    them at once, naming the reason, and vLLM computes the prompt); the client gets its answer."""
    failed = {**PARAMS, "error": "stage 1: [Errno 28] No space left on device"}
    client, seen = router(prefill_params=failed)
    resp = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "decoded"
    assert seen["decode"][0][1]["kv_transfer_params"] == failed
