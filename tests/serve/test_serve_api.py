"""`wavepp serve` over real HTTP: the openai client, prompt forms, usage, and every 400.

First tokens and logprobs are compared with transformers' on the same fp32 checkpoint, within
FP32_ATOL (the runtime's own bound for fp32 rounding, README "Determinism")."""

from __future__ import annotations

import math
import random

import httpx
import openai
import pytest

from tests.serve.conftest import MAX_POSITIONS, VOCAB, hf_logprobs

pytestmark = pytest.mark.slow
FP32_ATOL = 1e-4


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def _post(server, body, path="/v1/completions"):
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_openai_client_text_prompt_matches_transformers(server, tiny_model):
    text = "The capital of France is"
    out = _client(server).completions.create(
        model=server.model, prompt=text, max_tokens=1, logprobs=5
    )
    ids = list(text.encode())  # the byte-level tokenizer: one token per byte
    ref = hf_logprobs(tiny_model, ids)[-1]
    top_lp, top_ids = ref.topk(5)
    choice = out.choices[0]
    assert out.object == "text_completion" and out.model == server.model
    assert choice.text == bytes([int(top_ids[0])]).decode(errors="replace")
    assert set(choice.logprobs.top_logprobs[0]) == {_token_text(int(t)) for t in top_ids}
    assert math.isclose(choice.logprobs.token_logprobs[0], float(top_lp[0]), abs_tol=FP32_ATOL)
    got = sorted(choice.logprobs.top_logprobs[0].values(), reverse=True)
    assert len(got) == 5
    for g, r in zip(got, top_lp.tolist()):
        assert math.isclose(g, r, abs_tol=FP32_ATOL)
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 1
    assert out.usage.total_tokens == len(ids) + 1


def test_token_id_prompts_and_cached_tokens(server, tiny_model):
    rng = random.Random(3)
    prompts = [[rng.randrange(VOCAB) for _ in range(70)] for _ in range(2)]
    body = {"model": server.model, "prompt": prompts, "max_tokens": 1, "logprobs": 1}
    first = _post(server, body)
    assert first.status_code == 200, first.text
    data = first.json()
    assert [c["index"] for c in data["choices"]] == [0, 1]
    for choice, ids in zip(data["choices"], prompts):
        ref = hf_logprobs(tiny_model, ids)[-1]
        assert math.isclose(
            choice["logprobs"]["token_logprobs"][0], float(ref.max()), abs_tol=FP32_ATOL
        )
    assert data["usage"]["prompt_tokens"] == 140
    # the same prompts again: their full blocks come from the cache (block size 16)
    again = _post(server, body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 2 * 64
    for a, b in zip(data["choices"], again["choices"]):
        assert math.isclose(
            a["logprobs"]["token_logprobs"][0],
            b["logprobs"]["token_logprobs"][0],
            abs_tol=FP32_ATOL,
        )
    # one token-id list, not nested; max_tokens 0: prefill only, no text
    one = _post(server, {"prompt": prompts[0], "max_tokens": 0}).json()
    assert one["choices"][0]["text"] == "" and one["usage"]["completion_tokens"] == 0
    assert one["usage"]["prompt_tokens_details"]["cached_tokens"] == 64


def test_list_of_strings_and_echo(server):
    out = _client(server).completions.create(
        model=server.model, prompt=["ab", "xyz"], max_tokens=1, echo=True
    )
    assert [c.text[: len(p)] for c, p in zip(out.choices, ["ab", "xyz"])] == ["ab", "xyz"]
    assert all(len(c.text) == len(p) + 1 for c, p in zip(out.choices, ["ab", "xyz"]))
    assert out.usage.prompt_tokens == 5


def test_models_health_metrics(server):
    models = _client(server).models.list()
    assert [m.id for m in models.data] == [server.model]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    _post(server, {"prompt": [1, 2, 3]})
    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        'wavepp_requests_total{outcome="ok"}',
        "wavepp_requests_waiting",
        "wavepp_requests_running",
        "wavepp_prompt_tokens_total",
        "wavepp_cached_tokens_total",
        "wavepp_computed_tokens_total",
        "wavepp_prefix_hit_rate",
        "wavepp_ttft_seconds_bucket",
        "wavepp_queue_seconds_bucket",
        'wavepp_stage_busy_fraction{stage="1"}',
        "wavepp_admission_round_seconds_count",
        'wavepp_stage_blocks{stage="0",state="free"}',
        'wavepp_stage_blocks{stage="1",state="leased"}',
    ):
        assert name in text, name
    # the tiny Llama's 4 uniform layers: the count split, 2 | 2; the last stage also runs the
    # LM head, so its predicted share is the larger
    assert [_metric(text, f'wavepp_stage_layers{{stage="{i}"}}') for i in (0, 1)] == [2, 2]
    shares = [_metric(text, f'wavepp_stage_predicted_share{{stage="{i}"}}') for i in (0, 1)]
    assert math.isclose(sum(shares), 1.0) and 0.5 > shares[0] > 0.45
    ok = _metric(text, 'wavepp_requests_total{outcome="ok"}')
    _post(server, {"prompt": [4, 5, 6]})
    assert (
        _metric(httpx.get(f"{server.url}/metrics").text, 'wavepp_requests_total{outcome="ok"}')
        == ok + 1
    )


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": []}, "prompt", "non-empty"),
        ({"prompt": [[]]}, "prompt[0]", "empty"),
        ({"prompt": [1, 2, VOCAB]}, "prompt", "outside the vocabulary"),
        ({"prompt": [[1], [2, -1]]}, "prompt[1]", "outside the vocabulary"),
        ({"prompt": [1] * (MAX_POSITIONS + 1)}, "prompt", "at most 512 tokens"),
        ({"prompt": 2.7}, "prompt", "must be"),
        ({"prompt": [1, 2.5]}, "prompt", "must be integers"),
        ({"prompt": [1, True]}, "prompt", "must be integers"),
        ({"prompt": ["a", 3]}, "prompt[1]", "must be a string"),
        ({}, "prompt", "required"),
        ({"prompt": "a", "max_tokens": 16}, "max_tokens", "prefill engine"),
        ({"prompt": "a", "max_tokens": "1"}, "max_tokens", "integer"),
        ({"prompt": "a", "logprobs": 21}, "logprobs", "at most 20"),
        ({"prompt": "a", "echo": "yes"}, "echo", "boolean"),
        ({"prompt": "a", "model": "gpt-4"}, "model", "does not exist"),
        ({"prompt": "a", "n": 2}, "n", "one choice"),
    ],
)
def test_bad_input_is_400_naming_the_field(server, body, param, words):
    r = _post(server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_malformed_json_and_openai_error(server):
    r = httpx.post(
        f"{server.url}/v1/completions",
        content=b'{"prompt": [1, 2',
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", content=b"[1, 2]", timeout=10)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", content=b"[" * 5000 + b"]" * 5000, timeout=10)
    assert r.status_code == 400 and "nests too deeply" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="prefill engine"):
        _client(server).completions.create(model=server.model, prompt="hi", max_tokens=8)
    # the server still answers after all of the above
    assert _post(server, {"prompt": [7, 8, 9]}).status_code == 200


def _token_text(token_id: int) -> str:
    return chr(token_id) if token_id < 128 else f"token_id:{token_id}"


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


def test_echo_prompt_logprobs_match_transformers_never_from_cache(server, tiny_model):
    rng = random.Random(8)
    ids = [rng.randrange(VOCAB) for _ in range(50)]
    ref = hf_logprobs(tiny_model, ids)
    assert (
        _post(server, {"prompt": ids}).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        == 0
    )
    assert (
        _post(server, {"prompt": ids}).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        == 48
    )
    out = _post(server, {"prompt": ids, "echo": True, "max_tokens": 1, "prompt_logprobs": 2}).json()
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # computed, not reused
    plp = out["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    for p in range(1, len(ids)):
        entry = plp[p][str(ids[p])]
        assert math.isclose(entry["logprob"], float(ref[p - 1, ids[p]]), abs_tol=FP32_ATOL), p
        assert len(plp[p]) in (2, 3)  # the top 2, and the prompt's token if not among them
        for t, e in plp[p].items():
            assert math.isclose(e["logprob"], float(ref[p - 1, int(t)]), abs_tol=FP32_ATOL)
    # OpenAI's echo with logprobs: the prompt's tokens, then the first token
    legacy = _client(server).completions.create(
        model=server.model, prompt=ids, max_tokens=1, echo=True, logprobs=1
    )
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None
    for p in range(1, len(ids)):
        assert math.isclose(lp.token_logprobs[p], float(ref[p - 1, ids[p]]), abs_tol=FP32_ATOL)
    assert math.isclose(lp.token_logprobs[-1], float(ref[-1].max()), abs_tol=FP32_ATOL)


@pytest.mark.parametrize(
    "apply_softmax, item_first", [(True, False), (False, False), (False, True)]
)
def test_score_matches_transformers(server, tiny_model, apply_softmax, item_first):
    import torch

    rng = random.Random(21 + item_first)
    query = [rng.randrange(VOCAB) for _ in range(40)]
    items = [[rng.randrange(VOCAB) for _ in range(n)] for n in (3, 9, 17)]
    labels = [7, 42, 200]
    r = _post(
        server,
        {
            "model": server.model,
            "query": query,
            "items": items,
            "label_token_ids": labels,
            "apply_softmax": apply_softmax,
            "item_first": item_first,
        },
        path="/v1/score",
    )
    assert r.status_code == 200, r.text
    scores = r.json()["scores"]
    assert len(scores) == 3
    for item, row in zip(items, scores):
        context = item + query if item_first else query + item
        lp = hf_logprobs(tiny_model, context)[-1][labels]
        ref = torch.softmax(lp, -1) if apply_softmax else lp.exp()
        for got, want in zip(row, ref.tolist()):
            assert math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-7)
        if apply_softmax:
            assert math.isclose(sum(row), 1.0, abs_tol=1e-9)
    # the query is reused: a second call finds it (and the items) cached
    again = _post(
        server,
        {
            "query": query,
            "items": items,
            "label_token_ids": labels,
            "apply_softmax": apply_softmax,
            "item_first": item_first,
        },
        path="/v1/score",
    ).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert sum(again["scores"], []) == pytest.approx(sum(scores, []), rel=1e-4, abs=1e-7)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"items": ["a"], "label_token_ids": [1]}, "query"),
        ({"query": "a", "label_token_ids": [1]}, "items"),
        ({"query": "a", "items": [], "label_token_ids": [1]}, "items"),
        ({"query": "a", "items": ["b", ""], "label_token_ids": [1]}, "items[1]"),
        ({"query": "a", "items": ["b"], "label_token_ids": [VOCAB]}, "label_token_ids"),
        ({"query": "a", "items": ["b"]}, "label_token_ids"),
        (
            {"query": "a", "items": ["b"], "label_token_ids": [1], "apply_softmax": 1},
            "apply_softmax",
        ),
    ],
)
def test_score_bad_input_is_400(server, body, param):
    r = _post(server, body, path="/v1/score")
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_stage_samples_cover_a_request_on_every_stage(server):
    """GET /debug/stage_samples: the waves a fresh prompt ran, on every stage, with the chunks'
    new tokens adding up to the prompt and positive compute seconds (what the simulator's CPU
    hardware is fitted to)."""

    def samples():
        r = httpx.get(f"{server.url}/debug/stage_samples", timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    before = samples()
    prompt = [random.Random(11).randrange(VOCAB) for _ in range(83)]
    assert _post(server, {"prompt": prompt, "max_tokens": 1}).status_code == 200
    after = samples()
    new = after["stage_samples"][len(before["stage_samples"]) :]
    assert after["num_stages"] >= 2
    for stage in range(after["num_stages"]):
        mine = [s for s in new if s[0] == stage]
        assert sum(n for _, chunks, _ in mine for _, n in chunks) == len(prompt), new
        assert all(seconds > 0 for _, _, seconds in mine)
    spans = after["wave_spans"][len(before["wave_spans"]) :]
    assert len(spans) == len(new) and all(end >= start for _, _, start, end in spans)


def test_request_times_priority_and_vllm_histograms(server):
    """GET /debug/requests: the last request's phases, in order; vLLM's `priority` field is
    refused (400 naming it) where the server schedules first come, first served; the TTFT and
    queue histograms under vLLM's names, by priority."""
    prompt = [random.Random(12).randrange(VOCAB) for _ in range(40)]
    assert _post(server, {"prompt": prompt, "max_tokens": 1, "priority": 0}).status_code == 200
    last = httpx.get(f"{server.url}/debug/requests", timeout=60).json()["requests"][-1]
    assert last["prompt_tokens"] == 40 and last["priority"] == 0
    assert 0 <= last["queue_s"] <= last["admission_s"] <= last["dispatch_s"] <= last["ttft_s"]
    assert last["answer_s"] >= 0 and last["arrival_unix_s"] > 1.7e9
    for bad, words in ((1, "priority scheduling is not enabled"), ("high", "32-bit integer")):
        r = _post(server, {"prompt": prompt, "max_tokens": 1, "priority": bad})
        assert r.status_code == 400, r.text
        assert words in r.json()["error"]["message"] and r.json()["error"]["param"] == "priority"
    text = httpx.get(f"{server.url}/metrics").text
    assert _metric(text, 'vllm:time_to_first_token_seconds_count{priority="0"}') >= 1
    assert _metric(text, 'vllm:request_queue_time_seconds_count{priority="0"}') >= 1
