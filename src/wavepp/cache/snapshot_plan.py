"""Where a hybrid model's request saves recurrent-state snapshots, and the default interval.

A request that computes tokens [num_cached, num_tokens) saves the state at

    every grid boundary it crosses:  multiples of interval_blocks, over full blocks only
    its last reusable boundary:      (num_tokens - 1) // block_size blocks, so that a repeat
                                     of the prompt (which must compute >= 1 token) hits it

independently of how the planner cuts it into chunks: the scan passes every position, so a
chunk saves at each boundary inside it. That avoids three failures of saving only at chunk
ends or only at the last boundary: a prompt shorter than the interval never hits; a shared
prefix followed by a long unique suffix gets no hit (its boundaries were never kept); a chunk
shorter than the interval skips its snapshot.

Default interval: a snapshot costs a fixed S bytes (the states of the stage's linear layers)
against B * b bytes per block of attention KV. With the interval at I blocks, a request that
shares a prefix of P blocks loses on average I / 2 blocks of reuse (it resumes at the grid
point below P), and the grid costs S / I bytes per block. `default_interval_blocks` picks the
smallest I (the best hit rate) whose snapshots cost at most `max_overhead` of the blocks'
own memory: S / I <= max_overhead * B * b, i.e. I = ceil(S / (max_overhead * bytes_per_block)).
"""

from __future__ import annotations

import math


def snapshot_boundaries(
    num_cached_blocks: int, num_tokens: int, block_size: int, interval_blocks: int
) -> tuple[int, ...]:
    """Boundaries (in blocks, increasing) a request saves when it computes after
    `num_cached_blocks` reused blocks: grid points in (num_cached, full blocks], and its last
    reusable boundary."""
    if interval_blocks < 1 or block_size < 1:
        raise ValueError(
            f"interval_blocks and block_size must be >= 1, got {interval_blocks}, {block_size}"
        )
    num_full = num_tokens // block_size
    first = (num_cached_blocks // interval_blocks + 1) * interval_blocks
    boundaries = set(range(first, num_full + 1, interval_blocks))
    last_reusable = (num_tokens - 1) // block_size
    if last_reusable > num_cached_blocks:
        boundaries.add(last_reusable)
    return tuple(sorted(boundaries))


def default_interval_blocks(
    bytes_per_snapshot: int, bytes_per_block: int, *, max_overhead: float = 0.25
) -> int:
    """The smallest grid interval whose snapshots cost at most `max_overhead` of block memory
    (1 when blocks cost nothing: a stage of linear-attention layers only keeps snapshots at
    every block boundary it can afford)."""
    if bytes_per_snapshot <= 0:
        return 1
    if bytes_per_block <= 0:
        return 1
    return max(1, math.ceil(bytes_per_snapshot / (max_overhead * bytes_per_block)))
