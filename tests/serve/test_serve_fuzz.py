"""Any JSON body at any endpoint of `wavepp serve` gets a 2xx or a 4xx, never a 5xx: numbers of
any size (integers past Python's 4,300-digit limit, floats past double range), strings of any
length, any nesting, any field at any type. After the storm the server answers a normal request
as transformers does, and every stage's cache is back to idle (nothing leaked)."""

from __future__ import annotations

import json
import math
import random

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serve.conftest import VOCAB, hf_logprobs
from tests.serve.test_serve_edges import assert_clean

pytestmark = pytest.mark.slow

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/score", "/tokenize", "/detokenize")
FIELDS = (
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "echo",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "seed",
    "logit_bias",
    "kv_transfer_params",
    "model",
    "query",
    "items",
    "label_token_ids",
    "apply_softmax",
    "item_first",
    "tokens",
    "add_special_tokens",
    "add_generation_prompt",
    "continue_final_message",
    "return_token_strs",
    "user",
    "tools",
    "response_format",
    "min_tokens",
    "repetition_penalty",
)


class Raw:
    """A JSON number written as its text (what json.dumps cannot write: 5,000 digits, 1e999)."""

    def __init__(self, text: str):
        self.text = text


def render(value) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, list):
        return "[" + ",".join(render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + render(v) for k, v in value.items()) + "}"
    return json.dumps(value)


numbers = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.integers(min_value=0, max_value=VOCAB - 1)
    | st.builds(lambda n: Raw("9" * n), st.integers(min_value=4000, max_value=6000))
    | st.sampled_from([Raw("1e999"), Raw("-1e999"), Raw("1e-999"), Raw("-0")])
    | st.floats(allow_nan=False, allow_infinity=False)
)
strings = st.text(max_size=40) | st.builds(
    lambda c, n: c * n,
    st.sampled_from("a\u00e9\u4e2d\U0001f600 "),
    st.integers(min_value=1, max_value=20_000),
)
leaves = st.none() | st.booleans() | numbers | strings
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=20,
)
token_ids = st.lists(st.integers(min_value=0, max_value=VOCAB - 1), min_size=1, max_size=30)
# bodies shaped like each endpoint's, so that the checks past the first field are reached too
shaped = st.fixed_dictionaries(
    {},
    optional={
        "prompt": token_ids | st.text(min_size=1, max_size=30) | values,
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "system", "assistant", "x"]),
                    "content": strings | values,
                }
            ),
            min_size=1,
            max_size=3,
        )
        | values,
        "query": token_ids | values,
        "items": st.lists(token_ids, max_size=3) | values,
        "label_token_ids": st.lists(st.integers(0, VOCAB - 1), max_size=4) | values,
        "tokens": token_ids | values,
        **{f: values for f in FIELDS[2:20]},
    },
)
bodies = shaped | values


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(path=st.sampled_from(ENDPOINTS), body=bodies)
def _storm(url, client, path, body):
    r = client.post(
        f"{url}{path}", content=render(body).encode(), headers={"content-type": "application/json"}
    )
    assert r.status_code < 500, (path, render(body)[:300], r.status_code, r.text[:300])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["code"] == r.status_code and error["message"]


def test_no_body_at_any_endpoint_gets_a_5xx(server, tiny_model):
    with httpx.Client(timeout=60) as client:
        _storm(server.url, client)
    prompt = random.Random(9).choices(range(VOCAB), k=33)
    out = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": prompt, "logprobs": 1}, timeout=60
    ).json()
    ref = float(hf_logprobs(tiny_model, prompt)[-1].max())
    assert math.isclose(out["choices"][0]["logprobs"]["token_logprobs"][0], ref, abs_tol=1e-4)
    assert_clean(server)
