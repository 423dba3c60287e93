"""`wavepp serve` with the clients people use, over real HTTP: the `openai` SDK (streaming
completions, chat with and without streaming), vLLM's /tokenize and /detokenize, and the
sampling-field rule. References come from outside: transformers' model for logprobs, and
transformers' tokenizer applying the chat template for the chat's prompt."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tests.serve.conftest import hf_logprobs

pytestmark = pytest.mark.slow
FP32_ATOL = 1e-4
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a colour."},
]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def _post(server, path, body):
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def _chat_ids(tiny_model, messages=MESSAGES, **kwargs) -> list[int]:
    """transformers applying the model's chat template: the reference prompt."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tiny_model)
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _text(token_id: int) -> str:
    return chr(token_id) if token_id < 128 else f"token_id:{token_id}"


def test_openai_streaming_completions(server, tiny_model):
    text = "Streams of tokens"
    ref = hf_logprobs(tiny_model, list(text.encode()))[-1]
    top_lp, top_ids = ref.topk(3)
    chunks = list(
        _client(server).completions.create(
            model=server.model,
            prompt=text,
            max_tokens=1,
            logprobs=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len(chunks) == 2  # the token, then the usage
    first, last = chunks
    choice = first.choices[0]
    assert choice.text == _text(int(top_ids[0])) and choice.finish_reason == "length"
    assert math.isclose(choice.logprobs.token_logprobs[0], float(top_lp[0]), abs_tol=FP32_ATOL)
    assert set(choice.logprobs.top_logprobs[0]) == {_text(int(t)) for t in top_ids}
    assert (
        last.choices == []
        and last.usage.prompt_tokens == len(text)
        and last.usage.completion_tokens == 1
    )
    assert first.id == last.id and first.object == "text_completion"


def test_openai_chat_matches_the_template_and_transformers(server, tiny_model):
    ids = _chat_ids(tiny_model)
    ref = hf_logprobs(tiny_model, ids)[-1]
    top_lp, top_ids = ref.topk(4)
    out = _client(server).chat.completions.create(
        model=server.model,
        messages=MESSAGES,
        max_tokens=1,
        logprobs=True,
        top_logprobs=4,
        temperature=0,
        seed=1,
    )
    assert out.object == "chat.completion" and out.usage.prompt_tokens == len(ids)
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == _text(int(top_ids[0]))
    assert choice.finish_reason == "length"
    entry = choice.logprobs.content[0]
    assert math.isclose(entry.logprob, float(top_lp[0]), abs_tol=FP32_ATOL)
    assert entry.bytes == list(entry.token.encode())
    assert [t.token for t in entry.top_logprobs] == [_text(int(t)) for t in top_ids]
    for got, want in zip(entry.top_logprobs, top_lp.tolist()):
        assert math.isclose(got.logprob, want, abs_tol=FP32_ATOL)
    # max_completion_tokens 0: the prompt's cache only, no content
    zero = _client(server).chat.completions.create(
        model=server.model, messages=MESSAGES, max_completion_tokens=0
    )
    assert zero.choices[0].message.content == "" and zero.usage.completion_tokens == 0
    assert zero.usage.prompt_tokens_details.cached_tokens > 0  # the template's prefix, reused


def test_openai_chat_streaming(server, tiny_model):
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}],
        }
    ]
    ids = _chat_ids(tiny_model, [{"role": "user", "content": "two\nparts"}])
    best = int(hf_logprobs(tiny_model, ids)[-1].argmax())
    chunks = list(
        _client(server).chat.completions.create(
            model=server.model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert [c.object for c in chunks] == ["chat.completion.chunk"] * 3
    role, token, usage = chunks
    assert role.choices[0].delta.role == "assistant" and role.choices[0].finish_reason is None
    assert (
        token.choices[0].delta.content == _text(best) and token.choices[0].finish_reason == "length"
    )
    assert usage.choices == [] and usage.usage.prompt_tokens == len(ids)


def test_tokenize_and_detokenize_as_vllm(server, tiny_model):
    r = _post(
        server, "/tokenize", {"model": server.model, "prompt": "héllo", "return_token_strs": True}
    ).json()
    assert r["tokens"] == list("héllo".encode()) and r["count"] == 6 and r["max_model_len"] == 512
    assert len(r["token_strs"]) == 6
    chat = _post(server, "/tokenize", {"messages": MESSAGES}).json()
    assert chat["tokens"] == _chat_ids(tiny_model)
    assert _post(server, "/detokenize", {"tokens": r["tokens"]}).json() == {"prompt": "héllo"}
    # a client naming the model by its directory (as benchmarks loading its tokenizer do)
    assert (
        _post(
            server, "/tokenize", {"model": f"/somewhere/{server.model}", "prompt": "a"}
        ).status_code
        == 200
    )
    for path, body, param in [
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/detokenize", {"tokens": [1, 256]}, "tokens"),
        ("/detokenize", {"tokens": "ab"}, "tokens"),
        ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ]:
        res = _post(server, path, body)
        assert res.status_code == 400 and res.json()["error"]["param"] == param, res.text


ACCEPTED = [
    {"temperature": 0},
    {"temperature": 0.8, "top_k": 1},
    {"top_p": 0.5},
    {"top_k": 5},
    {"min_p": 0.2},
    {"seed": 7},
    {"presence_penalty": 1.5, "frequency_penalty": -1},
    {"repetition_penalty": 1.0},
    {"user": "u"},
    {"stop": ["\n"]},
    {"n": 1},
    {"logit_bias": {"5": 0}},
    {"ignore_eos": True},
    {"response_format": {"type": "text"}},
    {"best_of": 1},
    {"min_tokens": 0},
]
REFUSED = [
    ({"temperature": 0.7}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"n": 2}, "n"),
    ({"best_of": 3}, "best_of"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"min_tokens": 1}, "min_tokens"),
    ({"seed": 1.5}, "seed"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"allowed_token_ids": [1, 2]}, "allowed_token_ids"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
]


def test_sampling_fields_accepted_where_they_cannot_change_the_greedy_token(server, tiny_model):
    prompt = [11, 22, 33, 44]
    best = int(hf_logprobs(tiny_model, prompt)[-1].argmax())
    for extra in ACCEPTED:
        for path, body in (
            ("/v1/completions", {"prompt": prompt}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}]}),
        ):
            r = _post(server, path, {**body, **extra})
            assert r.status_code == 200, (path, extra, r.text)
        assert _post(server, "/v1/completions", {"prompt": prompt, **extra}).json()["choices"][0][
            "text"
        ] == _text(best)
    for extra, param in REFUSED:
        for path, body in (
            ("/v1/completions", {"prompt": prompt}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}]}),
        ):
            r = _post(server, path, {**body, **extra})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (
                path,
                extra,
                r.text,
            )


@pytest.mark.parametrize(
    "body, param",
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "messages[0].content[0]",
        ),
        ({"messages": MESSAGES, "max_tokens": 2}, "max_tokens"),
        ({"messages": MESSAGES, "max_completion_tokens": 5}, "max_completion_tokens"),
        ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": MESSAGES, "model": "gpt-4"}, "model"),
        (
            {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]},
            "tools",
        ),
        ({"messages": [{"role": "user", "content": "x" * 600}]}, "messages"),
    ],
)
def test_chat_bad_input_is_400_naming_the_field(server, body, param):
    r = _post(server, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.fixture(scope="module")
def kv_server(tiny_model, tmp_path_factory):
    from tests.serve.conftest import ServerProcess

    store = tmp_path_factory.mktemp("kv")
    srv = ServerProcess(tiny_model, "--kv-store", str(store))
    srv.store = store
    yield srv
    srv.stop()


def test_the_prefill_side_of_the_hand_off(kv_server, tiny_model):
    """What `wavepp route` sends a prefill (max_tokens 1, kv_transfer_params {"do_remote_decode":
    true}) is answered with the transfer's whereabouts, and every stage's part of the prompt's KV
    lands in the store before the answer comes, for completions and for chat (the template's
    prompt)."""
    from wavepp.kv_transfer.directory import DirectoryStore

    hand_off = {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    chat_ids = _chat_ids(tiny_model)
    store = DirectoryStore(kv_server.store)
    for path, body, ids in (
        ("/v1/completions", {"prompt": [5, 6, 7] * 20}, [5, 6, 7] * 20),
        ("/v1/chat/completions", {"messages": MESSAGES}, chat_ids),
    ):
        r = _post(kv_server, path, {**body, **hand_off})
        assert r.status_code == 200, r.text
        params = r.json()["kv_transfer_params"]
        assert (
            params["num_tokens"] == len(ids) and params["num_stages"] == 2 and "error" not in params
        )
        transfer = store.read(params["transfer_id"])  # the answer waited for every stage's part
        assert transfer.token_ids == ids and len(transfer.parts) == 2
    # refused with the field named: several prompts, a stream, and a server without a store
    for body in (
        {"prompt": [[1, 2], [3, 4]], **hand_off},
        {"prompt": [1, 2], "stream": True, **hand_off},
        {"prompt": [1, 2], "kv_transfer_params": "yes"},
    ):
        r = _post(kv_server, "/v1/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params", r.text


def test_a_hand_off_without_a_store_is_a_400(server):
    r = _post(
        server,
        "/v1/completions",
        {"prompt": [1, 2, 3], "kv_transfer_params": {"do_remote_decode": True}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params", r.text
    assert "kv_store" in r.json()["error"]["message"]
