"""One pipeline stage of any family: layers [start_layer, end_layer) of the decoder, plus the
token embedding on the first stage and the final norm + LM head on the last.

    first stage:   input_ids -> embed -> layers -> hidden  ─┐ (sent to the next stage)
    middle stage:  hidden -> layers -> hidden               ─┤
    last stage:    hidden -> layers -> norm(rows) -> lm_head -> logits [rows, vocab]

    layer:  hidden ─ norm ─ attention (GQA, MLA[+DSA] or KDA) ─ + ─ norm ─ MLP (dense or MoE) ─ +

Each layer is built from its `LayerSpec` (`spec/`): the modules come from the kinds, never
from the family. What crosses a stage boundary is one tensor [num_tokens, width]: the residual
stream, and, when the next stage starts with a layer that shares its predecessor's DSA top-k,
those top-k positions (int32, bit-cast into the model dtype as extra columns, so they travel
exactly with the activations):

    [0, hidden_size)  residual stream  |  [hidden_size, width)  top-k int32 bits (DSA only)

A one-stage model is first and last at once. Pure nn.Module: no processes, no scheduling; the
kernel paths come with each forward (`Kernels`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wavepp.models.batch import StageBatch
from wavepp.models.kernels import Kernels
from wavepp.models.layers.context import ForwardContext
from wavepp.models.layers.gqa import GQAttention
from wavepp.models.layers.kda import KimiDeltaAttention
from wavepp.models.layers.mla import MLAttention
from wavepp.models.layers.mlp import SwiGLUMLP
from wavepp.models.layers.moe import MoE
from wavepp.models.layers.norm import RMSNorm
from wavepp.models.layers.rope import RopeTable
from wavepp.models.paged_pools import PagedPools
from wavepp.models.spec import LayerSpec, ModelSpec, StageSpec, page_layout
from wavepp.models.stage_inputs import check_stage_inputs


class DecoderLayer(nn.Module):
    def __init__(self, spec: LayerSpec, layer: int, model: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, eps = model.hidden_size, model.rms_norm_eps
        self.input_norm = RMSNorm(hidden, eps, dtype)
        attention = spec.attention
        if attention.kind == "gqa":
            self.attn = GQAttention(attention, layer, hidden, eps, dtype)
        elif attention.kind == "mla":
            self.attn = MLAttention(attention, layer, hidden, dtype)
        else:
            self.attn = KimiDeltaAttention(attention, layer, hidden, dtype)
        self.post_attn_norm = RMSNorm(hidden, eps, dtype)
        self.mlp = (
            MoE(spec.mlp, hidden, dtype)
            if spec.mlp.kind == "moe"
            else SwiGLUMLP(hidden, spec.mlp.intermediate_size, dtype)
        )

    def forward(self, hidden: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        # hidden: [num_tokens, hidden_size] -> [num_tokens, hidden_size]
        hidden = hidden + self.attn(self.input_norm(hidden, ctx.kernels), ctx)
        return hidden + self.mlp(self.post_attn_norm(hidden, ctx.kernels), ctx.kernels)


class StageModel(nn.Module):
    """The slice `stage` of a model. Parameters are created empty; `load_stage_model` fills them."""

    def __init__(
        self,
        spec: ModelSpec,
        stage: StageSpec,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if stage.num_layers != spec.num_layers:
            raise ValueError(
                f"stage {stage} is for a {stage.num_layers}-layer model; "
                f"the config has {spec.num_layers} layers"
            )
        self.config, self.stage, self.dtype = spec, stage, dtype
        self.layout = page_layout(spec)
        with torch.device(device or "cpu"):
            shape = (spec.vocab_size, spec.hidden_size)
            self.embed = _param(dtype, *shape) if stage.is_first else None
            self.layers = nn.ModuleList(
                DecoderLayer(spec.layer(i), i, spec, dtype)
                for i in range(stage.start_layer, stage.end_layer)
            )
            self.norm = (
                RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype) if stage.is_last else None
            )
            self.lm_head = _param(dtype, *shape) if stage.is_last else None
            # a model whose layers rotate nothing (Kimi-Linear's MLA) has no table
            self.rotary = RopeTable(spec.rope, dtype) if spec.rope is not None else None

    @property
    def device(self) -> torch.device:
        """Where this stage's weights are (`.to(device)` moves them, its RoPE table too)."""
        return self.layers[0].input_norm.weight.device

    def new_kv_cache(
        self, num_blocks: int, block_size: int, num_state_slots: int | None = None
    ) -> PagedPools:
        """Zeroed pools of this stage's layers (the model's page layout), in the model dtype, on
        its device. Hybrid models also get `num_state_slots` snapshot slots (default: one per
        block)."""
        if num_state_slots is None:
            num_state_slots = num_blocks if self.layout.is_hybrid else 0
        return PagedPools(
            self.layout,
            self.stage,
            num_blocks,
            block_size,
            self.dtype,
            self.device,
            num_state_slots=num_state_slots,
        )

    @property
    def input_width(self) -> int:
        """Columns of the tensor this stage receives (hidden_size, plus top-k columns for DSA)."""
        return self._boundary_width(self.stage.start_layer)

    @property
    def output_width(self) -> int:
        return self._boundary_width(self.stage.end_layer)

    @torch.inference_mode()
    def forward(
        self,
        batch: StageBatch,
        kv_cache: PagedPools,
        *,
        input_ids: torch.Tensor | None = None,
        hidden_states: torch.Tensor | None = None,
        all_logits: bool = False,
        output_indices: torch.Tensor | None = None,
        kernels: Kernels | None = None,
    ) -> torch.Tensor:
        """Run the stage over every chunk of `batch`; writes the chunks' cache rows into `kv_cache`.

        First stage takes input_ids: [num_tokens] int64; others take hidden_states:
        [num_tokens, input_width] from the previous stage. Returns [num_tokens, output_width]
        in the model dtype, or, on the last stage, the fp32 logits of each chunk's last token
        [num_chunks, vocab_size] (of every token, [num_tokens, vocab_size], with all_logits; of
        the flat token rows `output_indices` asks for, [num_rows, vocab_size]). `kernels`: the
        paths to run (default `Kernels()`: F.linear, chunked attention). Inputs are checked
        before any compute, so a bad input leaves the cache untouched.
        """
        self._check(batch, kv_cache, input_ids, hidden_states)
        spec, kernels = self.config, kernels or Kernels()
        # cos, sin: [num_tokens, 1, rope_dim / 2], shared by all layers
        cos, sin = self.rotary(batch.positions) if self.rotary is not None else (None, None)
        ctx = ForwardContext(batch, kv_cache, kernels, cos, sin)
        if self.stage.is_first:
            hidden = self.embed_tokens(input_ids)
        else:
            hidden = hidden_states[:, : spec.hidden_size]
            if self.input_width > spec.hidden_size:
                ctx.topk = (
                    hidden_states[:, spec.hidden_size :].contiguous().view(torch.int32).long()
                )
        for layer in self.layers:
            hidden = layer(hidden, ctx)
        if not self.stage.is_last:
            if self.output_width == spec.hidden_size:
                return hidden
            return torch.cat((hidden, ctx.topk.to(torch.int32).view(self.dtype)), dim=-1)
        # last: rows of each chunk's last token, or the rows asked for (prompt logprobs), or
        # every row: [num_rows, hidden_size] -> logits [num_rows, vocab_size]; the head runs on those
        if output_indices is not None:
            hidden = hidden.index_select(0, output_indices)
        elif not all_logits:
            hidden = hidden.index_select(0, batch.last_token_indices)
        return self.logits(hidden, kernels)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The first stage's embedding: input_ids [num_tokens] -> hidden [num_tokens, hidden]."""
        return F.embedding(input_ids, self.embed)

    def logits(self, hidden: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        """The last stage's final norm and LM head: hidden [num_rows, hidden_size] -> fp32
        logits [num_rows, vocab_size]."""
        return kernels.project(self.norm(hidden, kernels), self.lm_head).float()

    def _boundary_width(self, layer: int) -> int:
        if not self.config.reuses_topk(layer):
            return self.config.hidden_size
        return (
            self.config.hidden_size
            + self.config.layer(layer).attention.index.topk * 4 // self.dtype.itemsize
        )

    def _check(
        self,
        batch: StageBatch,
        kv_cache: PagedPools,
        input_ids: torch.Tensor | None,
        hidden_states: torch.Tensor | None,
    ) -> None:
        if (
            not isinstance(kv_cache, PagedPools)
            or kv_cache.layout != self.layout
            or kv_cache.stage != self.stage
            or kv_cache.dtype != self.dtype
        ):
            raise ValueError(
                f"cache {kv_cache!r} was not made for stage {self.stage} of this "
                f"{self.layout.architecture} model in {self.dtype}: this stage needs "
                f"`new_kv_cache` of it"
            )
        inputs = input_ids if input_ids is not None else hidden_states
        for name, device in (
            ("kv cache", kv_cache.device),
            ("batch", batch.device),
            ("inputs", None if inputs is None else inputs.device),
        ):
            if device is not None and device != self.device:
                raise ValueError(
                    f"the {name} is on {device}, this stage's weights on {self.device}: "
                    f"move it there (StageBatch.to, tensor.to)"
                )
        check_stage_inputs(
            batch,
            self.stage,
            kv_cache,
            self.config.max_position_embeddings,
            self.config.vocab_size,
            self.input_width,
            self.dtype,
            input_ids,
            hidden_states,
        )


def _param(dtype: torch.dtype, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
