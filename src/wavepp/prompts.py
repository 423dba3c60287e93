"""A prompt as the engine takes it: a text or a sequence of int token ids, checked."""

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
