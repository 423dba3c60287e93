"""One pipeline stage of a MiniMax-M2, DeepSeek-V3, GLM-5 or Kimi-Linear model: layers [start, end), the
embedding on the first stage, the final norm and LM head on the last (as `StageModel`).

    layer:  hidden ─ norm ─ attention (GQA, MLA[+DSA] or KDA) ─ + ─ norm ─ MLP (dense or MoE) ─ +

What crosses a stage boundary is one tensor [num_tokens, width]: the residual stream, and,
when the next stage starts with a layer that shares its predecessor's DSA top-k, those top-k
positions (int32, bit-cast into the model dtype as extra columns, so they travel exactly
with the activations):

    [0, hidden_size)  residual stream  |  [hidden_size, width)  top-k int32 bits (DSA only)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wavepp.models.batch import StageBatch
from wavepp.models.config import StageSpec
from wavepp.models.kda_attention import KimiDeltaAttention
from wavepp.models.layers import RMSNorm, SwiGLUMLP
from wavepp.models.minimax_m2 import MiniMaxAttention
from wavepp.models.mla import MLAttention
from wavepp.models.moe import MoE
from wavepp.models.moe_config import MoEModelConfig
from wavepp.models.page_layout import page_layout
from wavepp.models.paged_pools import PagedPools
from wavepp.models.rope import RopeTable
from wavepp.models.stage_model import check_stage_inputs


class MoEDecoderLayer(nn.Module):
    def __init__(self, config: MoEModelConfig, layer: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer = layer
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        if config.is_linear(layer):
            self.attn = KimiDeltaAttention(config, layer, dtype)
        else:
            self.attn = MLAttention(config, layer, dtype) if config.is_mla else MiniMaxAttention(config, dtype)
        self.post_attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MoE(config, dtype) if config.is_moe(layer) else \
            SwiGLUMLP(config.hidden_size, config.intermediate_size, dtype)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: StageBatch,
                pools: PagedPools, topk: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        # hidden: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
        x = self.input_norm(hidden)
        if isinstance(self.attn, KimiDeltaAttention):
            out = self.attn(x, batch, pools)
        elif isinstance(self.attn, MLAttention):
            out, topk = self.attn(x, cos, sin, batch, pools, topk)
        else:
            out = self.attn(x, cos, sin, batch, pools.view("key", self.layer), pools.view("value", self.layer))
        hidden = hidden + out
        return hidden + self.mlp(self.post_attn_norm(hidden)), topk


class MoEStageModel(nn.Module):
    """The slice `stage` of a MoEModelConfig model. Parameters are created empty; the loader fills them."""

    def __init__(self, config: MoEModelConfig, stage: StageSpec, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        if stage.num_layers != config.num_layers:
            raise ValueError(f"stage {stage} is for a {stage.num_layers}-layer model; "
                             f"the config has {config.num_layers} layers")
        self.config, self.stage, self.dtype = config, stage, dtype
        self.layout = page_layout(config)
        shape = (config.vocab_size, config.hidden_size)
        self.embed = _param(dtype, *shape) if stage.is_first else None
        self.layers = nn.ModuleList(MoEDecoderLayer(config, layer, dtype)
                                    for layer in range(stage.start_layer, stage.end_layer))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype) if stage.is_last else None
        self.lm_head = _param(dtype, *shape) if stage.is_last else None
        rope_dim = config.qk_rope_head_dim if config.is_mla else config.rotary_dim
        # Kimi-Linear's MLA has no RoPE (position comes from its KDA layers): no table
        self.rotary = RopeTable(rope_dim, config.rope_theta, config.max_position_embeddings, dtype,
                                config.rope_scaling) if config.uses_rope else None

    def new_kv_cache(self, num_blocks: int, block_size: int, num_state_slots: int | None = None) -> PagedPools:
        """Zeroed pools of this stage's layers (the architecture's page layout), in the model dtype.
        Hybrid models also get `num_state_slots` snapshot slots (default: one per block)."""
        if num_state_slots is None:
            num_state_slots = num_blocks if self.layout.is_hybrid else 0
        return PagedPools(self.layout, self.stage, num_blocks, block_size, self.dtype,
                          num_state_slots=num_state_slots)

    @property
    def input_width(self) -> int:
        """Columns of the tensor this stage receives (hidden_size, plus top-k columns for DSA)."""
        return self._boundary_width(self.stage.start_layer)

    @property
    def output_width(self) -> int:
        return self._boundary_width(self.stage.end_layer)

    @torch.inference_mode()
    def forward(self, batch: StageBatch, kv_cache: PagedPools, *, input_ids: torch.Tensor | None = None,
                hidden_states: torch.Tensor | None = None, all_logits: bool = False,
                output_indices: torch.Tensor | None = None) -> torch.Tensor:
        """Run the stage over every chunk of `batch`; writes the chunks' cache rows into `kv_cache`.

        First stage takes input_ids: [num_tokens] int64; others take hidden_states:
        [num_tokens, input_width] from the previous stage. Returns [num_tokens, output_width]
        in the model dtype, or, on the last stage, the fp32 logits of each chunk's last token
        [num_chunks, vocab_size] (of every token, [num_tokens, vocab_size], with all_logits; of
        the flat token rows `output_indices` asks for, [num_rows, vocab_size]).
        Inputs are checked before any compute.
        """
        self._check(batch, kv_cache, input_ids, hidden_states)
        topk = None
        if self.stage.is_first:
            hidden = F.embedding(input_ids, self.embed)
        else:
            hidden = hidden_states[:, :self.config.hidden_size]
            if self.input_width > self.config.hidden_size:
                topk = hidden_states[:, self.config.hidden_size:].contiguous().view(torch.int32).long()
        # cos, sin: [num_tokens, 1, rope_dim / 2], shared by all layers
        cos, sin = self.rotary(batch.positions) if self.rotary is not None else (None, None)
        for layer in self.layers:
            hidden, topk = layer(hidden, cos, sin, batch, kv_cache, topk)
        if not self.stage.is_last:
            if self.output_width == self.config.hidden_size:
                return hidden
            return torch.cat((hidden, topk.to(torch.int32).view(self.dtype)), dim=-1)
        if output_indices is not None:
            hidden = hidden.index_select(0, output_indices)
        elif not all_logits:
            hidden = hidden.index_select(0, batch.last_token_indices)
        return F.linear(self.norm(hidden), self.lm_head).float()

    def _boundary_width(self, layer: int) -> int:
        if not self.config.reuses_topk(layer):
            return self.config.hidden_size
        return self.config.hidden_size + self.config.index_topk * 4 // self.dtype.itemsize

    def _check(self, batch: StageBatch, kv_cache: PagedPools, input_ids: torch.Tensor | None,
               hidden_states: torch.Tensor | None) -> None:
        if not isinstance(kv_cache, PagedPools) or kv_cache.layout != self.layout \
                or kv_cache.stage != self.stage or kv_cache.dtype != self.dtype:
            raise ValueError(f"cache {kv_cache!r} was not made for stage {self.stage} of this "
                             f"{self.layout.architecture} model in {self.dtype}")
        check_stage_inputs(batch, self.stage, kv_cache.block_size, kv_cache.num_blocks,
                           self.config.max_position_embeddings, self.config.vocab_size, self.input_width,
                           self.dtype, input_ids, hidden_states)
        if kv_cache.states:
            for chunk in batch.chunks:
                slots = [s for _, s in chunk.state_saves] + ([chunk.state_in] if chunk.state_in is not None else [])
                if any(not 0 <= s < kv_cache.num_state_slots for s in slots):
                    raise ValueError(f"chunk of request {chunk.request_id!r} names a state slot outside "
                                     f"[0, {kv_cache.num_state_slots})")
                if chunk.num_cached_tokens and chunk.state_in is None:
                    raise ValueError(f"chunk of request {chunk.request_id!r} resumes after "
                                     f"{chunk.num_cached_tokens} tokens with no state_in: its linear-"
                                     f"attention layers need the state saved there")


def _param(dtype: torch.dtype, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
