"""Grouped-query attention over the paged key and value pools (`spec/attention.py` GQASpec).

    x ─ qkv_proj (+ bias) ─ q heads | k heads | v heads
        q, k: RMSNorm per head (Qwen3) or over the whole projection (MiniMax-M2), or none
        q, k: RoPE rotate-half on the first rotary_dim dims of each head
        k, v ─ written to the key / value pools at the batch's slots
    q ─ attention over each chunk's context [0, end) (the stage's kernel) ─ o_proj (+ bias)

Each chunk's [0, num_cached) is in the cache already; its new tokens go in first, so that
attention reads the whole context from one place.
"""

from __future__ import annotations

import torch
from torch import nn

from wavepp.models.layers.context import ForwardContext
from wavepp.models.layers.norm import RMSNorm
from wavepp.models.layers.rope import apply_rope, apply_rotary
from wavepp.models.spec import GQASpec


class GQAttention(nn.Module):
    def __init__(
        self, spec: GQASpec, layer: int, hidden_size: int, norm_eps: float, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.spec, self.layer = spec, layer
        self.scale = spec.head_dim**-0.5
        qkv_size = spec.q_size + 2 * spec.kv_size
        self.qkv_proj = _param(dtype, qkv_size, hidden_size)
        self.qkv_bias = _param(dtype, qkv_size) if spec.qkv_bias else None
        self.o_proj = _param(dtype, hidden_size, spec.q_size)
        self.o_bias = _param(dtype, hidden_size) if spec.o_bias else None
        widths = {
            "none": None,
            "head": (spec.head_dim, spec.head_dim),
            "projection": (spec.q_size, spec.kv_size),
        }
        norm = widths[spec.qk_norm]
        self.q_norm = RMSNorm(norm[0], norm_eps, dtype) if norm else None
        self.k_norm = RMSNorm(norm[1], norm_eps, dtype) if norm else None

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x: [num_tokens, hidden] -> [num_tokens, hidden]. Writes the batch's K/V into this
        layer's key and value pools at batch.slot_mapping."""
        spec, kernels, n = self.spec, ctx.kernels, x.shape[0]
        heads, kv_heads = spec.num_heads, spec.num_kv_heads
        heads_view = (-1, kv_heads, spec.head_dim)
        key_cache = ctx.cache.view("key", self.layer).view(heads_view)
        value_cache = ctx.cache.view("value", self.layer).view(heads_view)
        qkv = kernels.project(x, self.qkv_proj, self.qkv_bias)
        if spec.qk_norm == "projection":
            q, k, v = qkv.split([spec.q_size, spec.kv_size, spec.kv_size], dim=-1)
            # q: [n, heads, head_dim], k: [n, kv_heads, head_dim], normalized over all heads
            q = self.q_norm(q, kernels).view(n, heads, spec.head_dim)
            k = self.k_norm(k, kernels).view(n, kv_heads, spec.head_dim)
            q, k = self._rotate(q, ctx), self._rotate(k, ctx)
            v = v.view(n, kv_heads, spec.head_dim)
        else:
            # qkv: [n, heads + 2 * kv_heads, head_dim]  (q heads | k heads | v heads); q and k
            # rotate together: qk: [n, heads + kv_heads, head_dim]
            qkv = qkv.view(n, -1, spec.head_dim)
            if self.q_norm is not None:
                qk = torch.cat(
                    (
                        self.q_norm(qkv[:, :heads], kernels),
                        self.k_norm(qkv[:, heads : heads + kv_heads], kernels),
                    ),
                    1,
                )
            else:
                qk = qkv[:, : heads + kv_heads]
            qk = self._rotate(qk, ctx)
            q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
        key_cache.index_copy_(0, ctx.batch.slot_mapping, k)
        value_cache.index_copy_(0, ctx.batch.slot_mapping, v)
        out = kernels.attend(q, key_cache, value_cache, ctx.batch, self.scale)
        # out: [n, heads * head_dim] -> [n, hidden]
        return kernels.project(out, self.o_proj, self.o_bias)

    def _rotate(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        # x: [n, heads, head_dim]: RoPE on [0, rotary_dim) of each head, the rest as it is
        r = self.spec.rotary_dim
        if r == self.spec.head_dim:
            return apply_rotary(x, ctx.cos, ctx.sin, ctx.kernels)
        return torch.cat(
            (apply_rope(x[..., :r], ctx.cos, ctx.sin, kernels=ctx.kernels), x[..., r:]), dim=-1
        )


def _param(dtype: torch.dtype, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
