"""What the SnapshotPool state machines share: the prompts they draw and their record of a
request."""

from dataclasses import dataclass

import hypothesis.strategies as st


def prompts_from(bases, lengths, max_suffix: int):
    """Prompts of at least two tokens: a prefix of one of `bases` (one of `lengths` long), then up
    to `max_suffix` tokens of 0 and 1."""
    return st.builds(
        lambda base, length, suffix: bases[base][:length] + suffix,
        st.sampled_from(range(len(bases))),
        st.sampled_from(lengths),
        st.lists(st.integers(0, 1), max_size=max_suffix),
    ).filter(lambda p: len(p) >= 2)


@dataclass
class Model:
    hashes: list[int]
    num_tokens: int
    num_leased: int
    phase: str  # committed | materialized
    num_published: int = 0
