"""Server-sent events read raw, byte by byte as a client receives them: the events' framing
and order, the usage chunk, [DONE] last; a client that disconnects mid-stream aborts its
request and leaves every stage clean; a client holding a half-sent request, or not reading
its stream, delays nobody else."""

from __future__ import annotations

import json
import math
import random
import socket
import time

import httpx
import pytest

from tests.serve.conftest import VOCAB, hf_logprobs
from tests.serve.test_serve_edges import aborted_after_disconnect, assert_clean, metric

pytestmark = pytest.mark.slow
FP32_ATOL = 1e-4


def parse_sse(raw: bytes) -> list:
    """The data of each event: JSON, or the string "[DONE]". Every event is one `data:` line
    ended by a blank line; anything else fails."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-100:]
    events = []
    for block in text[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, block[:200]
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(n)]


def test_completion_stream_events_in_order(server, tiny_model):
    prompts = _prompts(3, 40, seed=31)
    r = httpx.post(
        f"{server.url}/v1/completions",
        timeout=60,
        json={
            "prompt": prompts,
            "stream": True,
            "logprobs": 2,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.content)
    assert events[-1] == "[DONE]" and len(events) == 5  # a chunk per prompt, the usage, [DONE]
    chunks, usage = events[:3], events[3]
    assert sorted(c["choices"][0]["index"] for c in chunks) == [0, 1, 2]
    assert len({c["id"] for c in events[:4]}) == 1
    for c in chunks:
        assert c["object"] == "text_completion" and len(c["choices"]) == 1 and "usage" not in c
        choice = c["choices"][0]
        assert choice["finish_reason"] == "length"
        ref = hf_logprobs(tiny_model, prompts[choice["index"]])[-1]
        assert math.isclose(
            choice["logprobs"]["token_logprobs"][0], float(ref.max()), abs_tol=FP32_ATOL
        )
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 120
    assert usage["usage"]["completion_tokens"] == 3
    # without include_usage: no usage chunk; max_tokens 0: the chunk has no text
    plain = parse_sse(
        httpx.post(
            f"{server.url}/v1/completions",
            timeout=60,
            json={"prompt": prompts[0], "stream": True, "max_tokens": 0},
        ).content
    )
    assert len(plain) == 2 and plain[1] == "[DONE]" and plain[0]["choices"][0]["text"] == ""


def test_chat_stream_events_in_order(server):
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        timeout=60,
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "logprobs": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = parse_sse(r.content)
    assert events[-1] == "[DONE]" and len(events) == 4
    role, token, usage = events[:3]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert (
        token["choices"][0]["finish_reason"] == "length"
        and len(token["choices"][0]["delta"]["content"]) == 1
    )
    assert token["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []  # top_logprobs 0
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 1


def test_disconnect_mid_stream_aborts_the_request(server):
    aborted = 'wavepp_requests_total{outcome="aborted"}'
    ok = 'wavepp_requests_total{outcome="ok"}'
    # the stream's headers come as soon as the prompts are queued; the client leaves then,
    # usually while they are still queued or running (else they finish: try fresh prompts)
    for attempt in range(5):
        before_aborted, before_ok = metric(server, aborted), metric(server, ok)
        body = {"prompt": _prompts(6, 480, seed=200 + attempt), "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
        if aborted_after_disconnect(
            server, aborted, ok, before_aborted, before_ok, 6, 30, "stream"
        ):
            break
    else:
        pytest.fail("no prompt was still running when its client disconnected, in 5 tries")
    assert_clean(server)
    assert server.tracebacks == 0, "".join(server.output)[-3000:]


def test_slow_clients_delay_nobody(server, tiny_model):
    """20 clients that send half a request and wait, and 4 that ask for a stream and never
    read it, beside one normal client: its answer comes as fast as alone (within a second or
    two on a loaded machine)."""
    prompt = _prompts(1, 64, seed=41)[0]
    body = json.dumps({"prompt": prompt, "logprobs": 1}).encode()
    t0 = time.monotonic()
    assert httpx.post(f"{server.url}/v1/completions", content=body, timeout=60).status_code == 200
    alone_s = time.monotonic() - t0
    half, unread = [], []
    try:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body[: len(body) // 2]
            )
            half.append(s)
        for i in range(4):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            stream = json.dumps(
                {
                    "prompt": _prompts(8, 60, seed=50 + i),
                    "stream": True,
                    "logprobs": 20,
                    "echo": True,
                }
            ).encode()
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(stream) + stream
            )
            unread.append(s)
        time.sleep(0.5)
        t0 = time.monotonic()
        r = httpx.post(f"{server.url}/v1/completions", content=body, timeout=60)
        beside_s = time.monotonic() - t0
    finally:
        for s in half + unread:
            s.close()
    assert r.status_code == 200
    lp = r.json()["choices"][0]["logprobs"]["token_logprobs"][0]
    assert math.isclose(lp, float(hf_logprobs(tiny_model, prompt)[-1].max()), abs_tol=FP32_ATOL)
    assert beside_s < max(2.0, 5 * alone_s), (beside_s, alone_s)
    time.sleep(0.5)
    assert_clean(server)


def test_streaming_abort_storm_leaves_every_stage_clean(server):
    """300 streams from 32 clients, a third of them leaving at a random moment (up to 80 ms,
    about the latency under this load; measured: 57 left, 26 of them aborted in the engine,
    the others had finished there): every stream read to its end is whole, and afterwards no
    stage holds a lease, escrow or live request, and the server logged no traceback."""
    import asyncio

    rng = random.Random(61)
    prefixes = _prompts(4, 96, seed=60)
    plan = [
        (
            prefixes[i % 4] + _prompts(1, rng.randrange(8, 64), seed=1000 + i)[0],
            rng.uniform(0, 0.08) if rng.random() < 1 / 3 else None,
        )
        for i in range(300)
    ]
    aborted_before = metric(server, 'wavepp_requests_total{outcome="aborted"}')

    async def one(client, ids, leave_after_s):
        body = {"prompt": ids, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            if leave_after_s is not None:
                try:
                    await asyncio.wait_for(r.aread(), leave_after_s)
                except asyncio.TimeoutError:
                    return "left"
                return "finished"
            events = parse_sse(await r.aread())
            assert (
                events[-1] == "[DONE]"
                and len(events) == 3
                and events[1]["usage"]["prompt_tokens"] == len(ids)
            )
            return "read"

    async def main():
        sem = asyncio.Semaphore(32)
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:

            async def bounded(ids, leave):
                async with sem:
                    return await one(client, ids, leave)

            return await asyncio.gather(*(bounded(ids, leave) for ids, leave in plan))

    outcomes = asyncio.run(main())
    assert outcomes.count("read") == sum(leave is None for _, leave in plan)
    assert outcomes.count("left") > 0
    deadline = time.monotonic() + 30
    while metric(server, 'wavepp_requests_total{outcome="aborted"}') == aborted_before:
        assert time.monotonic() < deadline, "no stream that left was aborted"
        time.sleep(0.1)
    assert_clean(server)
    assert server.tracebacks == 0, "".join(server.output)[-3000:]
