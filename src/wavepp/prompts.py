"""A prompt as the engine takes it: a text or a sequence of int token ids, checked; and the
options a request carries beside it (`check_request_options`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

Prompt = str | Sequence[int]


def prompt_token_ids(
    prompt: Prompt, tokenizer, vocab_size: int, add_special_tokens: bool = True
) -> list[int]:
    """Token ids of a text (the model's tokenizer; `add_special_tokens` as transformers has
    it) or of a sequence of ints, checked against the vocabulary. Anything else (bytes,
    floats, bools, nested lists) is refused."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("empty prompt: at least one token is needed")
        token_ids = tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    elif isinstance(prompt, (bytes, bytearray, memoryview)):
        raise ValueError("a prompt is a str or a sequence of int token ids, not bytes")
    else:
        try:
            token_ids = list(prompt)
        except TypeError:
            raise ValueError(
                f"a prompt is a str or a sequence of int token ids, got {type(prompt).__name__}"
            ) from None
        for i, t in enumerate(token_ids):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise ValueError(
                    f"token {i} of the prompt is {t!r} ({type(t).__name__}); token ids must be ints"
                )
        token_ids = [int(t) for t in token_ids]
    if not token_ids:
        raise ValueError("empty prompt: at least one token is needed")
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    return token_ids


def check_request_options(
    num_tokens: int,
    request_id: object,
    logprob_start: object,
    priority: object,
    scheduling_policy: str,
) -> None:
    """A request's options beside its prompt of `num_tokens`, each a ValueError naming it: an
    int id (or None), a prompt position to return logprobs from (or None), and an int priority,
    other than 0 only under priority scheduling (vLLM refuses one it does not schedule by)."""
    if request_id is not None and (not isinstance(request_id, int) or isinstance(request_id, bool)):
        raise ValueError(f"request_id must be an int, got {request_id!r}")
    if logprob_start is not None and (
        isinstance(logprob_start, bool)
        or not isinstance(logprob_start, int)
        or not 0 <= logprob_start < num_tokens
    ):
        raise ValueError(
            f"logprob_start must be a position of the prompt [0, {num_tokens}), "
            f"got {logprob_start!r}"
        )
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an int, got {priority!r}")
    if priority != 0 and scheduling_policy != "priority":
        raise ValueError(
            "priority scheduling is not enabled: start the engine with "
            "scheduling_policy='priority' (--scheduling-policy priority)"
        )
