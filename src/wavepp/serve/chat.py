"""Request bodies of /v1/chat/completions, /tokenize and /detokenize, checked by hand so that
every refusal names its field (as completion_request.py does for completions and scoring).

A chat's prompt is its messages rendered by the model's chat template (the tokenizer's, as
transformers applies it), with the assistant's turn opened (add_generation_prompt); the first
token of that prompt's answer is the reply.
"""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.openai_http import APIError, short
from wavepp.serve.completion_request import (
    check_model,
    optional_bool,
    parse_kv_transfer,
    parse_max_tokens,
    parse_priority,
    parse_stream,
)
from wavepp.serve.sampling import check_sampling

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[dict, ...]  # {"role", "content": str}, content parts joined
    max_tokens: int  # 0 or 1
    top_logprobs: int | None  # None: no logprobs; else the first token's top k (0..)
    add_generation_prompt: bool
    continue_final_message: bool
    stream: bool = False
    include_usage: bool = False
    kv_transfer: bool = False
    priority: int = 0  # vLLM's: lower is more urgent (--scheduling-policy priority)


@dataclass(frozen=True)
class TokenizeRequest:
    prompt: str | None  # a completion's text, or
    messages: tuple[dict, ...] | None  # a chat's messages, rendered by the chat template
    add_special_tokens: bool
    add_generation_prompt: bool
    continue_final_message: bool
    return_token_strs: bool


def parse_chat(body, model_names: tuple[str, ...], max_top_k: int) -> ChatRequest:
    """Check a /v1/chat/completions body; raise APIError(400) naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_model(body, model_names)
    messages = parse_messages(body.get("messages"))
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = parse_max_tokens(body, name)
    check_sampling(body)
    stream, include_usage = parse_stream(body)
    logprobs = optional_bool(body, "logprobs", False)
    top = body.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise APIError(
                400,
                f"top_logprobs must be a non-negative integer, got {short(top)}",
                "top_logprobs",
            )
        if top > max_top_k:
            raise APIError(
                400, f"top_logprobs={top}: at most {max_top_k} top logprobs", "top_logprobs"
            )
        if not logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
    generation, final = _template_flags(body)
    return ChatRequest(
        messages,
        max_tokens,
        (top or 0) if logprobs else None,
        generation,
        final,
        stream,
        include_usage,
        parse_kv_transfer(body, stream),
        parse_priority(body),
    )


def parse_tokenize(body, model_names: tuple[str, ...]) -> TokenizeRequest:
    """vLLM's /tokenize: {"prompt"} (add_special_tokens default true) or {"messages"} (default
    false: the template adds what it needs)."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_model(body, model_names)
    strs = optional_bool(body, "return_token_strs", False)
    if "messages" in body:
        messages = parse_messages(body["messages"])
        generation, final = _template_flags(body)
        return TokenizeRequest(
            None,
            messages,
            optional_bool(body, "add_special_tokens", False),
            generation,
            final,
            strs,
        )
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise APIError(
            400, f"prompt must be a string (or send messages), got {short(prompt)}", "prompt"
        )
    return TokenizeRequest(
        prompt, None, optional_bool(body, "add_special_tokens", True), False, False, strs
    )


def parse_cache_query(body, model_names: tuple[str, ...]) -> TokenizeRequest | list:
    """POST /v1/cache_query: a /tokenize body, or {"prompt": [token ids]} (returned as the
    list: the engine checks the ids)."""
    if isinstance(body, dict) and isinstance(body.get("prompt"), list) and "messages" not in body:
        check_model(body, model_names)
        return body["prompt"]
    return parse_tokenize(body, model_names)


def parse_detokenize(body, model_names: tuple[str, ...], vocab_size: int) -> list[int]:
    """vLLM's /detokenize: {"tokens": [ids]} -> the ids."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_model(body, model_names)
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise APIError(400, f"tokens must be a list of token ids, got {short(tokens)}", "tokens")
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise APIError(
                400,
                f"tokens[{i}] is {short(t)}: token ids are integers in [0, {vocab_size})",
                "tokens",
            )
    return tokens


def parse_messages(messages) -> tuple[dict, ...]:
    """OpenAI's messages: a non-empty list of {"role", "content"}, content a string or a list
    of text parts (joined with newlines, as vLLM joins them); other parts are refused."""
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(messages):
        name = f"messages[{i}]"
        if not isinstance(m, dict):
            raise APIError(400, f"{name} must be an object with role and content", name)
        role = m.get("role")
        if role not in ROLES:
            raise APIError(
                400,
                f"{name}.role must be one of {', '.join(ROLES)}, got {short(role)}",
                f"{name}.role",
            )
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        elif isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not (
                    isinstance(part, dict)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    raise APIError(
                        400,
                        f'{name}.content[{j}]: only text parts ({{"type": "text", '
                        f'"text": ...}}) are supported',
                        f"{name}.content[{j}]",
                    )
                texts.append(part["text"])
            content = "\n".join(texts)
        elif not isinstance(content, str):
            raise APIError(
                400,
                f"{name}.content must be a string or a list of text parts, got {short(content)}",
                f"{name}.content",
            )
        out.append({"role": role, "content": content})
    return tuple(out)


def _template_flags(body: dict) -> tuple[bool, bool]:
    generation = optional_bool(body, "add_generation_prompt", True)
    final = optional_bool(body, "continue_final_message", False)
    if final and generation and body.get("add_generation_prompt") is not None:
        raise APIError(
            400,
            "continue_final_message and add_generation_prompt cannot both be true",
            "continue_final_message",
        )
    return (False, True) if final else (generation, False)
