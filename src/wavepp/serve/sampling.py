"""The sampling fields clients send, and the one rule for them: a prefill engine answers with
the greedy first token, so a field is accepted when, at the value sent, it cannot change that
token (or the single choice), and refused with a 400 naming it when it could.

    field                          accepted                      why
    temperature                    0, or any with top_k 1        0 is greedy; above 0 it samples
    top_p                          (0, 1]                        the nucleus always holds the best token
    top_k                          -1, 0 or >= 1                 the best token is always among the top k
    min_p                          [0, 1]                        the best token is never below p * itself
    seed                           any integer                   greedy draws nothing
    presence_penalty,              [-2, 2]                       they count generated tokens: none before
    frequency_penalty                                            the first
    repetition_penalty             1                             it penalizes the prompt's tokens too
    logit_bias                     every bias 0                  a bias moves the logits
    n, best_of                     1                             one choice per prompt
    min_tokens                     0                             it bans the end-of-text token at first
    bad_words, allowed_token_ids   empty                         they remove tokens
    response_format                {"type": "text"}              a schema constrains the token
    tools                          empty, or tool_choice "none"  the template and the token change
    user, stop, stop_token_ids,    any                           they do not choose the token
    ignore_eos, ...

Fields not named here are ignored, as OpenAI's and vLLM's servers ignore fields they do not
know. `stop` and `stop_token_ids` are accepted but not applied: the one token is the answer.
"""

from __future__ import annotations

import math

from wavepp.openai_http import APIError, short


def check_sampling(body: dict) -> None:
    """Raise APIError(400) naming the first field whose value could change the greedy first
    token (or ask for more than one choice); see the table above."""
    temperature = _number(body, "temperature", low=0.0, high=math.inf)
    top_k = _int(body, "top_k")
    if temperature not in (None, 0) and top_k != 1:
        raise APIError(
            400,
            f"temperature={temperature}: this server answers with the greedy first "
            f"token; send temperature 0 (or top_k 1)",
            "temperature",
        )
    if top_k is not None and top_k < -1:
        raise APIError(400, f"top_k must be -1, 0 or a positive integer, got {top_k}", "top_k")
    top_p = _number(body, "top_p", low=0.0, high=1.0)
    if top_p == 0:
        raise APIError(400, "top_p must be in (0, 1]", "top_p")
    _number(body, "min_p", low=0.0, high=1.0)
    _int(body, "seed")
    _number(body, "presence_penalty", low=-2.0, high=2.0)
    _number(body, "frequency_penalty", low=-2.0, high=2.0)
    repetition = _number(body, "repetition_penalty", low=0.0, high=math.inf)
    if repetition not in (None, 1):
        raise APIError(
            400,
            f"repetition_penalty={repetition}: it would penalize the prompt's tokens "
            f"and could change the first token; send 1 or leave it out",
            "repetition_penalty",
        )
    for name in ("n", "best_of"):
        value = _int(body, name)
        if value not in (None, 1):
            raise APIError(
                400, f"{name}={value}: a prefill engine returns one choice per prompt", name
            )
    min_tokens = _int(body, "min_tokens")
    if min_tokens not in (None, 0):
        raise APIError(
            400,
            f"min_tokens={min_tokens}: it bans the end-of-text token, which could "
            f"change the first token; send 0 or leave it out",
            "min_tokens",
        )
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise APIError(400, "logit_bias must be an object of token id -> bias", "logit_bias")
        if any(v != 0 for v in bias.values()):
            raise APIError(
                400, "logit_bias: a non-zero bias could change the greedy first token", "logit_bias"
            )
    for name in ("bad_words", "allowed_token_ids"):
        if body.get(name):
            raise APIError(
                400, f"{name}: removing tokens could change the greedy first token", name
            )
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise APIError(
            400,
            'response_format: only {"type": "text"}; a format or schema could '
            "change the first token",
            "response_format",
        )
    if body.get("tools") and body.get("tool_choice") != "none":
        raise APIError(
            400, 'tools: tool calling is not supported (or send tool_choice "none")', "tools"
        )


def _number(body: dict, name: str, *, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        bounds = f"[{low:g}, {high:g}]" if high != math.inf else f">= {low:g}"
        raise APIError(400, f"{name} must be a number {bounds}, got {short(value)}", name)
    return value


def _int(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, f"{name} must be an integer, got {short(value)}", name)
    return value
