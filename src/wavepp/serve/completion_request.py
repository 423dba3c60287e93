"""Request bodies of the HTTP API, checked by hand so that every refusal names its field.

A body is parsed into a frozen record (CompletionRequest, ScoreRequest) or refused with an
APIError; nothing here touches the engine, so the checks are cheap and testable alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from wavepp.openai_http import APIError, short
from wavepp.serve.sampling import check_sampling

Prompt = str | list[int]


@dataclass(frozen=True)
class CompletionRequest:
    prompts: tuple[Prompt, ...]
    max_tokens: int  # 0 or 1: this is a prefill engine
    logprobs: int | None  # top-k of the first token
    echo: bool
    prompt_logprobs: int | None  # vLLM's extension: logprobs of the prompt's own tokens
    user: str | None = None
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    kv_transfer: bool = False  # kv_transfer_params {"do_remote_decode": true}: hand the KV on
    priority: int = 0  # vLLM's: lower is more urgent (--scheduling-policy priority)


@dataclass(frozen=True)
class ScoreRequest:
    query: Prompt
    items: tuple[Prompt, ...]
    label_token_ids: tuple[int, ...]
    apply_softmax: bool
    item_first: bool


def parse_completion(body, model_names: tuple[str, ...], max_top_k: int) -> CompletionRequest:
    """Check a /v1/completions body; raise APIError(400) naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_model(body, model_names)
    prompts = _prompts(body.get("prompt"), "prompt")
    max_tokens = body.get("max_tokens", 1)
    max_tokens = parse_max_tokens(body, "max_tokens")
    check_sampling(body)
    stream, include_usage = parse_stream(body)
    logprobs = _optional_k(body, "logprobs", max_top_k)
    prompt_logprobs = _optional_k(body, "prompt_logprobs", max_top_k)
    echo = optional_bool(body, "echo", False)
    user = body.get("user")
    kv_transfer = parse_kv_transfer(body, stream)
    if kv_transfer and len(prompts) > 1:
        raise APIError(
            400, "kv_transfer_params: one prompt per request hands its KV on", "kv_transfer_params"
        )
    return CompletionRequest(
        prompts,
        max_tokens,
        logprobs,
        echo,
        prompt_logprobs,
        user if isinstance(user, str) else None,
        stream,
        include_usage,
        kv_transfer,
        parse_priority(body),
    )


def parse_priority(body: dict) -> int:
    """vLLM's `priority`: an integer, lower first, default 0 (the server refuses one other
    than 0 unless it schedules by priority)."""
    priority = body.get("priority", 0)
    if priority is None:
        return 0
    if not _is_int(priority) or not -(2**31) <= priority < 2**31:
        raise APIError(400, f"priority must be a 32-bit integer, got {short(priority)}", "priority")
    return priority


def parse_kv_transfer(body: dict, stream: bool) -> bool:
    """vLLM's disaggregation field on the prefill side: {"do_remote_decode": true} asks for the
    prompt's KV in the store (the answer's kv_transfer_params says where); anything else is
    the decode side's and ignored here."""
    params = body.get("kv_transfer_params")
    if params is None:
        return False
    if not isinstance(params, dict):
        raise APIError(
            400, f"kv_transfer_params must be an object, got {short(params)}", "kv_transfer_params"
        )
    wanted = params.get("do_remote_decode", False)
    if not isinstance(wanted, bool):
        raise APIError(
            400,
            f"kv_transfer_params.do_remote_decode must be a boolean, got {short(wanted)}",
            "kv_transfer_params",
        )
    if wanted and stream:
        raise APIError(
            400,
            "kv_transfer_params: the hand-off answers in JSON; send stream=false",
            "kv_transfer_params",
        )
    return wanted


def parse_json(raw: bytes):
    """The request body as JSON; 400 if it is not JSON, nests deeper than the parser goes, or
    holds an integer longer than Python converts (4,300 digits: a ValueError that is not a
    JSONDecodeError)."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise APIError(
            400, "the request body is not valid JSON here: it nests too deeply"
        ) from None


def parse_max_tokens(body: dict, name: str) -> int:
    """0 (prefill only) or 1 (the first token; the default)."""
    max_tokens = body.get(name, 1)
    if max_tokens is None:
        max_tokens = 1
    if not _is_int(max_tokens) or max_tokens < 0:
        raise APIError(400, f"{name} must be a non-negative integer, got {short(max_tokens)}", name)
    if max_tokens > 1:
        raise APIError(
            400,
            f"{name}={max_tokens}: this is a prefill engine; it computes the "
            f"prompt and its first token only ({name} 0 or 1)",
            name,
        )
    return max_tokens


def parse_stream(body: dict) -> tuple[bool, bool]:
    """(stream, stream_options.include_usage)."""
    stream = optional_bool(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise APIError(
            400, f"stream_options must be an object, got {short(options)}", "stream_options"
        )
    if not stream:
        raise APIError(400, "stream_options is only allowed with stream=true", "stream_options")
    include_usage = options.get("include_usage", False)
    if include_usage is None:
        include_usage = False
    if not isinstance(include_usage, bool):
        raise APIError(
            400,
            f"stream_options.include_usage must be a boolean, got {short(include_usage)}",
            "stream_options.include_usage",
        )
    return stream, include_usage


def optional_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be a boolean, got {short(value)}", name)
    return value


def parse_score(body, model_names: tuple[str, ...], vocab_size: int) -> ScoreRequest:
    """Check a /v1/score body (SGLang / vLLM generative scoring)."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_model(body, model_names)
    query = body.get("query")
    if query is None:
        raise APIError(400, "query is required", "query")
    query = _prompts(query, "query")
    if len(query) != 1:
        raise APIError(400, "query must be one prompt (a string or a list of token ids)", "query")
    items = body.get("items")
    if items is None:
        raise APIError(400, "items is required", "items")
    if isinstance(items, (str, dict)) or (isinstance(items, list) and items and _is_int(items[0])):
        items = [items]
    if not isinstance(items, list) or not items:
        raise APIError(
            400, "items must be a non-empty list of strings or of token-id lists", "items"
        )
    item_prompts = []
    for i, item in enumerate(items):
        one = _prompts(item, f"items[{i}]")
        if len(one) != 1:
            raise APIError(400, f"items[{i}] must be one prompt", f"items[{i}]")
        item_prompts.append(one[0])
    labels = body.get("label_token_ids")
    if not isinstance(labels, list) or not labels or not all(_is_int(t) for t in labels):
        raise APIError(
            400, "label_token_ids must be a non-empty list of token ids", "label_token_ids"
        )
    bad = [t for t in labels if not 0 <= t < vocab_size]
    if bad:
        raise APIError(
            400,
            f"label_token_ids: token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
            "label_token_ids",
        )
    apply_softmax = body.get("apply_softmax", False)
    item_first = body.get("item_first", False)
    for name, value in (("apply_softmax", apply_softmax), ("item_first", item_first)):
        if not isinstance(value, bool):
            raise APIError(400, f"{name} must be a boolean, got {short(value)}", name)
    return ScoreRequest(query[0], tuple(item_prompts), tuple(labels), apply_softmax, item_first)


# ---- helpers ---------------------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_model(body: dict, model_names: tuple[str, ...]) -> None:
    """`model` absent, or one of the served names, or a path whose last part is one (a client
    that names the model by its directory, as benchmarks that load its tokenizer do)."""
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise APIError(400, f"model must be a string, got {short(model)}", "model")
    if model not in model_names and model.rstrip("/").rsplit("/", 1)[-1] not in model_names:
        raise APIError(
            400,
            f"The model `{short(model)}` does not exist; this server serves "
            f"{', '.join(model_names)}",
            "model",
        )


def _prompts(prompt, field: str) -> tuple[Prompt, ...]:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    if prompt is None:
        raise APIError(400, f"{field} is required", field)
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], (int, float)):
        prompts = [prompt]  # token ids (each checked below)
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise APIError(
            400,
            f"{field} must be a non-empty string, list of strings, list of token "
            f"ids or list of token-id lists",
            field,
        )
    for i, p in enumerate(prompts):
        name = field if len(prompts) == 1 and prompts[0] is prompt else f"{field}[{i}]"
        if isinstance(p, str):
            if not p:
                raise APIError(400, f"{name} is empty: at least one token is needed", name)
        elif isinstance(p, list):
            if not p:
                raise APIError(400, f"{name} is empty: at least one token is needed", name)
            for j, t in enumerate(p):
                if not _is_int(t):
                    raise APIError(
                        400, f"{name}: token {j} is {short(t)}; token ids must be integers", name
                    )
        else:
            raise APIError(
                400, f"{name} must be a string or a list of token ids, got {type(p).__name__}", name
            )
    return tuple(prompts)


def _optional_k(body: dict, name: str, max_top_k: int) -> int | None:
    k = body.get(name)
    if k is None:
        return None
    if not _is_int(k) or k < 0:
        raise APIError(400, f"{name} must be a non-negative integer, got {short(k)}", name)
    if k > max_top_k:
        raise APIError(400, f"{name}={k}: at most {max_top_k} top logprobs", name)
    return k
