"""Token-id prompts the family tests share."""

from __future__ import annotations

import random


def two_prefix_prompts(vocab: int, seed: int, per_prefix: int = 3) -> list[list[int]]:
    """Two prefixes of 20-40 tokens, `per_prefix` suffixes of 1-11 tokens each, and an exact
    repeat of the first prompt (a whole-prompt cache hit)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(vocab) for _ in range(rng.randrange(20, 40))] for _ in range(2)]
    prompts = [
        p + [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
        for p in prefixes
        for _ in range(per_prefix)
    ]
    return prompts + [list(prompts[0])]
