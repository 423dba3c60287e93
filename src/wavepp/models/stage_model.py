"""One pipeline stage of a Llama-family model: layers [start_layer, end_layer) of the decoder,
plus the token embedding on the first stage and the final norm + LM head on the last.

    first stage:   input_ids -> embed -> layers -> hidden  ─┐ (sent to the next stage)
    middle stage:  hidden -> layers -> hidden               ─┤
    last stage:    hidden -> layers -> norm(last tokens) -> lm_head -> logits [num_chunks, vocab]

A one-stage model is first and last at once. Pure nn.Module: no processes, no scheduling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wavepp.models.attention import Attention
from wavepp.models.batch import StageBatch
from wavepp.models.config import ModelConfig, StageSpec
from wavepp.models.kernels import linear
from wavepp.models.kv_cache import PagedKVCache
from wavepp.models.layers import RMSNorm, RotaryEmbedding, SwiGLUMLP


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.attn = Attention(config, dtype)
        self.post_attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, dtype)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: StageBatch, key_cache: torch.Tensor, value_cache: torch.Tensor) -> torch.Tensor:
        # hidden: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
        hidden = hidden + self.attn(self.input_norm(hidden), cos, sin, batch, key_cache, value_cache)
        return hidden + self.mlp(self.post_attn_norm(hidden))


class StageModel(nn.Module):
    """The slice `stage` of a model. Parameters are created empty; `load_stage_model` fills them."""

    def __init__(self, config: ModelConfig, stage: StageSpec, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        if stage.num_layers != config.num_layers:
            raise ValueError(f"stage {stage} is for a {stage.num_layers}-layer model; "
                             f"the config has {config.num_layers} layers")
        self.config, self.stage, self.dtype = config, stage, dtype
        shape = (config.vocab_size, config.hidden_size)
        self.embed = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False) if stage.is_first else None
        self.layers = nn.ModuleList(DecoderLayer(config, dtype) for _ in range(stage.num_stage_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype) if stage.is_last else None
        self.lm_head = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False) if stage.is_last else None
        self.rotary = RotaryEmbedding(config, dtype)

    @property
    def device(self) -> torch.device:
        """Where this stage's weights are (`.to(device)` moves them, its rotary tables too)."""
        return self.rotary.cos.device

    def new_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """A zeroed cache shaped for this stage's layers, in the model dtype, on its device."""
        return PagedKVCache.for_stage(self.config, self.stage, num_blocks, block_size, self.dtype, self.device)

    @property
    def input_width(self) -> int:
        """Columns of the tensor a later stage receives: the residual stream."""
        return self.config.hidden_size

    @property
    def output_width(self) -> int:
        return self.config.hidden_size

    @torch.inference_mode()
    def forward(self, batch: StageBatch, kv_cache: PagedKVCache, *,
                input_ids: torch.Tensor | None = None,
                hidden_states: torch.Tensor | None = None,
                output_indices: torch.Tensor | None = None) -> torch.Tensor:
        """Run the stage over every chunk of `batch`; writes the chunks' K/V into `kv_cache`.

        First stage takes input_ids: [num_tokens] int64; others take hidden_states:
        [num_tokens, hidden_size] from the previous stage. Returns hidden states
        [num_tokens, hidden_size] in the model dtype, or, on the last stage, the fp32 logits
        of each chunk's last token [num_chunks, vocab_size] (or of the flat token rows
        `output_indices` [num_rows] asks for: [num_rows, vocab_size]). Inputs are checked before
        any compute, so a bad input leaves the cache untouched.
        """
        self._check(batch, kv_cache, input_ids, hidden_states)
        if self.stage.is_first:
            hidden = F.embedding(input_ids, self.embed)
        else:
            hidden = hidden_states
        # cos, sin: [num_tokens, 1, head_dim / 2], shared by all layers
        cos, sin = self.rotary(batch.positions)
        for index, layer in enumerate(self.layers):
            key_cache, value_cache = kv_cache.layer(index)
            hidden = layer(hidden, cos, sin, batch, key_cache, value_cache)
        if not self.stage.is_last:
            return hidden
        # last: [num_rows, hidden_size] -> logits: [num_rows, vocab_size]; rows: each chunk's last
        # token, or the rows asked for (prompt logprobs): the head runs on those only
        rows = batch.last_token_indices if output_indices is None else output_indices
        last = self.norm(hidden.index_select(0, rows))
        return linear(last, self.lm_head).float()

    def _check(self, batch: StageBatch, kv_cache: PagedKVCache, input_ids: torch.Tensor | None,
               hidden_states: torch.Tensor | None) -> None:
        config = self.config
        expected = (self.stage.num_stage_layers, config.num_kv_heads, config.head_dim, self.dtype)
        got = (kv_cache.num_layers, kv_cache.num_kv_heads, kv_cache.head_dim, kv_cache.dtype)
        if got != expected:
            raise ValueError(f"kv cache (layers, kv heads, head_dim, dtype) = {got}; "
                             f"this stage needs {expected}")
        inputs = input_ids if input_ids is not None else hidden_states
        for name, device in (("kv cache", kv_cache.device), ("batch", batch.device),
                             ("inputs", None if inputs is None else inputs.device)):
            if device is not None and device != self.device:
                raise ValueError(f"the {name} is on {device}, this stage's weights on {self.device}: "
                                 f"move it there (StageBatch.to, tensor.to)")
        check_stage_inputs(batch, self.stage, kv_cache.block_size, kv_cache.num_blocks, self.rotary.max_positions,
                           config.vocab_size, config.hidden_size, self.dtype, input_ids, hidden_states)


def check_stage_inputs(batch: StageBatch, stage: StageSpec, block_size: int, num_blocks: int,
                       max_positions: int, vocab_size: int, input_width: int, dtype: torch.dtype,
                       input_ids: torch.Tensor | None, hidden_states: torch.Tensor | None) -> None:
    """What every stage model checks of a batch before running it: blocks and positions fit
    its cache and its rotary table; the first stage gets input_ids, the others hidden states
    [num_tokens, input_width] in the model's dtype. Raises ValueError naming what is off."""
    if batch.block_size != block_size:
        raise ValueError(f"batch block_size {batch.block_size} != cache block_size {block_size}")
    if batch.max_block_id >= num_blocks:
        raise ValueError(f"block id {batch.max_block_id} is outside the cache's {num_blocks} blocks")
    if batch.max_position >= max_positions:
        raise ValueError(f"position {batch.max_position} is beyond the model's "
                         f"max_position_embeddings={max_positions}")
    if stage.is_first:
        _check_input_ids(input_ids, batch.num_tokens, vocab_size)
    elif input_ids is not None or hidden_states is None:
        raise ValueError(f"stage {stage} is not the first: pass hidden_states, not input_ids")
    elif hidden_states.shape != (batch.num_tokens, input_width) or hidden_states.dtype != dtype:
        raise ValueError(f"hidden_states {tuple(hidden_states.shape)} {hidden_states.dtype}; expected "
                         f"[{batch.num_tokens}, {input_width}] {dtype}")


def _check_input_ids(input_ids: torch.Tensor | None, num_tokens: int, vocab_size: int) -> None:
    if input_ids is None:
        raise ValueError("the first stage needs input_ids")
    if input_ids.dtype != torch.int64 or input_ids.shape != (num_tokens,):
        raise ValueError(f"input_ids must be int64 [{num_tokens}] (one per batch token), got "
                         f"{input_ids.dtype} {list(input_ids.shape)}")
    bad = (input_ids < 0) | (input_ids >= vocab_size)
    if bool(bad.any()):
        index = int(bad.nonzero()[0, 0])
        raise ValueError(f"token id {int(input_ids[index])} at batch position {index} is outside "
                         f"the vocabulary [0, {vocab_size})")
