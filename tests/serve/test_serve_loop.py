"""The server's event loop never waits on the engine: with the engine's lock held (as its LOOP
thread holds it while it plans a wave) and a request's submit blocked on it, the server still
answers other requests at once; once the lock is free, the blocked request completes.

In-process, over real HTTP on loopback, with an engine double whose every locked method takes
one lock the test holds: no pipeline, a second or two."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import httpx
import pytest

from tests.serve.conftest import app_in_thread
from wavepp.engine import PrefillResult
from wavepp.runtime.core_stats import EngineLoad
from wavepp.serve import ServeConfig, build_app

# an answer that does not touch the lock comes in milliseconds; with the loop blocked it would
# never come while the test holds the lock. Generous, for a loaded machine
FAST_S = 5.0


class LockedEngine:
    """The Engine's surface the server uses; submit, abort and load take `lock`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.config = SimpleNamespace(top_k=5, pp=2, dtype="float32", block_size=16)
        self.policy = "fake"
        self.vocab_size = 256
        self.stage_num_blocks = (8, 8)
        self.max_prompt_tokens = 128
        self.submitted = []
        self.aborted = []
        self.tokenizer = SimpleNamespace(
            token_text=lambda t: self.decode([t]), max_token_chars=lambda: 1, prepare=lambda: None
        )

    def tokenize(self, prompt, *, add_special_tokens=True):
        return list(prompt.encode()) if isinstance(prompt, str) else list(prompt)

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")

    def token_strs(self, ids):
        return [chr(t) for t in ids]

    def apply_chat_template(self, messages, **kwargs):
        return self.tokenize("".join(m["content"] for m in messages))

    def submit(self, ids, logprob_start=None, kv_transfer=False, priority=0):
        with self.lock:
            fut = Future()
            fut.request_id = len(self.submitted)
            self.submitted.append(ids)
            fut.set_result(
                PrefillResult(
                    fut.request_id, len(ids), 0, ids[-1], -0.5, ((ids[-1], -0.5),), 0.01, 0.0
                )
            )
            return fut

    def abort(self, request_id):
        with self.lock:
            self.aborted.append(request_id)

    def load(self):
        with self.lock:
            return EngineLoad(0, 0, None)

    def stats(self):
        raise RuntimeError("no stats here")

    def stage_capacity(self):
        return []


@pytest.fixture
def served():
    engine = LockedEngine()
    with app_in_thread(build_app(engine, ServeConfig("fake")), timeout_s=20) as url:
        yield engine, url


def test_a_blocked_submit_does_not_block_other_requests(served):
    engine, url = served
    engine.lock.acquire()  # the engine is busy planning
    blocked = {}

    def request(key, path, body):
        blocked[key] = httpx.post(f"{url}{path}", json=body, timeout=30)

    threads = [
        threading.Thread(
            target=request, args=("completion", "/v1/completions", {"prompt": [1, 2, 3]})
        ),
        threading.Thread(
            target=request, args=("stream", "/v1/completions", {"prompt": [4, 5], "stream": True})
        ),
        threading.Thread(
            target=request,
            args=(
                "chat",
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}]},
            ),
        ),
    ]
    try:
        for t in threads:
            t.start()
        time.sleep(0.3)  # all three are now inside submit, waiting for the lock
        assert not blocked
        for _ in range(3):  # the loop answers what does not need the lock
            assert httpx.get(f"{url}/v1/models", timeout=FAST_S).json()["data"][0]["id"] == "fake"
            r = httpx.post(f"{url}/tokenize", json={"prompt": "abc"}, timeout=FAST_S)
            assert r.json()["tokens"] == [97, 98, 99]
            assert (
                httpx.post(f"{url}/v1/completions", content=b"[" * 5000, timeout=FAST_S).status_code
                == 400
            )
        assert not blocked  # and the three are still waiting for the lock
    finally:
        engine.lock.release()
    for t in threads:
        t.join(30)
    assert (
        blocked["completion"].status_code == 200
        and blocked["completion"].json()["choices"][0]["text"] == "\x03"
    )
    assert blocked["chat"].json()["choices"][0]["message"]["content"] == "i"
    assert blocked["stream"].text.endswith("data: [DONE]\n\n")
    assert len(engine.submitted) == 3


def test_deep_and_malformed_bodies_are_400_never_500(served):
    _, url = served
    bodies = [
        b"[" * 5000 + b"]" * 5000,
        b'{"prompt": ' + b"[" * 100_000,
        b'{"prompt": [1, ' + b"[" * 900 + b"]" * 901 + b"}",
        b'{"messages": [{"role": "user", "content": ' + b"[" * 900 + b"]" * 900 + b"}]}",
        b"\xff\xfe",
        b"",
        b"null",
        b'"text"',
        b'{"prompt": {"a": 1}}',
        b'{"prompt": NaN, "temperature": Infinity}',
        b'{"prompt": [1], "temperature": NaN}',
        b'{"prompt": [1], "max_tokens": -Infinity}',
    ]
    for path in (
        "/v1/completions",
        "/v1/chat/completions",
        "/tokenize",
        "/detokenize",
        "/v1/score",
    ):
        for body in bodies:
            r = httpx.post(f"{url}{path}", content=body, timeout=10)
            assert r.status_code == 400, (path, body[:40], r.text[:200])
            assert r.json()["error"]["type"] == "invalid_request_error"


def _json_values():
    from hypothesis import strategies as st

    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=8)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
        ),
        max_leaves=12,
    )


FIELDS = (
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "echo",
    "prompt_logprobs",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "seed",
    "stop",
    "logit_bias",
    "response_format",
    "tools",
    "model",
    "query",
    "items",
    "label_token_ids",
    "tokens",
    "add_generation_prompt",
    "continue_final_message",
    "return_token_strs",
    "add_special_tokens",
)


def test_no_body_reaches_a_500(served):
    """Any JSON in any of the fields the endpoints read: 200 or 400, never a 500."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    _, url = served
    client = httpx.Client(base_url=url, timeout=30)
    bodies = st.dictionaries(st.sampled_from(FIELDS), _json_values(), max_size=5) | _json_values()
    paths = st.sampled_from(
        ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", "/v1/score"]
    )

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(paths, bodies)
    def check(path, body):
        r = client.post(path, json=body)
        assert r.status_code in (200, 400), (path, body, r.status_code, r.text[:300])

    try:
        check()
    finally:
        client.close()
