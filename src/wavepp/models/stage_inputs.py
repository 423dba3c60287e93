"""What a stage model checks of a batch before running it, so a bad input leaves the cache as
it was: blocks, positions and state slots fit its cache and its RoPE table; the first stage
gets input_ids, the others hidden states [num_tokens, input_width] in the model's dtype."""

from __future__ import annotations

import torch

from wavepp.models.batch import StageBatch
from wavepp.models.paged_pools import PagedPools
from wavepp.models.spec import StageSpec


def check_stage_inputs(
    batch: StageBatch,
    stage: StageSpec,
    cache: PagedPools,
    max_positions: int,
    vocab_size: int,
    input_width: int,
    dtype: torch.dtype,
    input_ids: torch.Tensor | None,
    hidden_states: torch.Tensor | None,
) -> None:
    """Raises ValueError naming what is off."""
    if batch.block_size != cache.block_size:
        raise ValueError(
            f"batch block_size {batch.block_size} != cache block_size {cache.block_size}"
        )
    if batch.max_block_id >= cache.num_blocks:
        raise ValueError(
            f"block id {batch.max_block_id} is outside the cache's {cache.num_blocks} blocks"
        )
    if batch.max_position >= max_positions:
        raise ValueError(
            f"position {batch.max_position} is beyond the model's "
            f"max_position_embeddings={max_positions}"
        )
    if stage.is_first:
        _check_input_ids(input_ids, batch.num_tokens, vocab_size)
    elif input_ids is not None or hidden_states is None:
        raise ValueError(f"stage {stage} is not the first: pass hidden_states, not input_ids")
    elif hidden_states.shape != (batch.num_tokens, input_width) or hidden_states.dtype != dtype:
        raise ValueError(
            f"hidden_states {tuple(hidden_states.shape)} {hidden_states.dtype}; expected "
            f"[{batch.num_tokens}, {input_width}] {dtype}"
        )
    if cache.states:
        _check_state_slots(batch, cache.num_state_slots)


def _check_state_slots(batch: StageBatch, num_state_slots: int) -> None:
    for chunk in batch.chunks:
        slots = [s for _, s in chunk.state_saves] + (
            [chunk.state_in] if chunk.state_in is not None else []
        )
        if any(not 0 <= s < num_state_slots for s in slots):
            raise ValueError(
                f"chunk of request {chunk.request_id!r} names a state slot outside "
                f"[0, {num_state_slots})"
            )
        if chunk.num_cached_tokens and chunk.state_in is None:
            raise ValueError(
                f"chunk of request {chunk.request_id!r} resumes after "
                f"{chunk.num_cached_tokens} tokens with no state_in: its linear-"
                f"attention layers need the state saved there"
            )


def _check_input_ids(input_ids: torch.Tensor | None, num_tokens: int, vocab_size: int) -> None:
    if input_ids is None:
        raise ValueError("the first stage needs input_ids")
    if input_ids.dtype != torch.int64 or input_ids.shape != (num_tokens,):
        raise ValueError(
            f"input_ids must be int64 [{num_tokens}] (one per batch token), got "
            f"{input_ids.dtype} {list(input_ids.shape)}"
        )
    bad = (input_ids < 0) | (input_ids >= vocab_size)
    if bool(bad.any()):
        index = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"token id {int(input_ids[index])} at batch position {index} is outside "
            f"the vocabulary [0, {vocab_size})"
        )
