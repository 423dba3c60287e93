"""MiniMax-M2 attention: GQA whose q and k are RMS-normalized over the whole projection (all
heads at once, not per head), then rotated on the first `rotary_dim` dims of each head.

    x -> qkv_proj -> q [heads * head_dim] -> q_norm ─┐ RoPE on [0, rotary_dim) of each head
                  -> k [kv_heads * head_dim] -> k_norm ┘ -> key pool
                  -> v -> value pool
    paged_attention over the cache (the Llama path's), then o_proj.
"""

from __future__ import annotations

import torch
from torch import nn

from wavepp.models.attention import paged_attention
from wavepp.models.batch import StageBatch
from wavepp.models.kernels import linear
from wavepp.models.layers import RMSNorm
from wavepp.models.moe_config import MoEModelConfig
from wavepp.models.rope import apply_rope


class MiniMaxAttention(nn.Module):
    def __init__(self, config: MoEModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim, self.rotary_dim = config.head_dim, config.rotary_dim
        self.scale = config.head_dim ** -0.5
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.q_size, self.kv_size = q_size, kv_size
        self.qkv_proj = _param(dtype, q_size + 2 * kv_size, config.hidden_size)
        self.o_proj = _param(dtype, config.hidden_size, q_size)
        self.q_norm = RMSNorm(q_size, config.rms_norm_eps, dtype)
        self.k_norm = RMSNorm(kv_size, config.rms_norm_eps, dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: StageBatch,
                key_cache: torch.Tensor, value_cache: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, hidden] -> [num_tokens, hidden]. Writes the batch's K/V into the flat
        pools key_cache / value_cache ([num_slots, kv_heads * head_dim]) at batch.slot_mapping."""
        n = x.shape[0]
        q, k, v = linear(x, self.qkv_proj).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # q: [n, heads, head_dim], k: [n, kv_heads, head_dim]
        q = self.q_norm(q).view(n, self.num_heads, self.head_dim)
        k = self.k_norm(k).view(n, self.num_kv_heads, self.head_dim)
        r = self.rotary_dim
        q = torch.cat((apply_rope(q[..., :r], cos, sin), q[..., r:]), dim=-1)
        k = torch.cat((apply_rope(k[..., :r], cos, sin), k[..., r:]), dim=-1)
        key_cache.index_copy_(0, batch.slot_mapping, k.reshape(n, self.kv_size))
        value_cache.index_copy_(0, batch.slot_mapping, v)
        heads_view = (-1, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, key_cache.view(heads_view), value_cache.view(heads_view), batch, self.scale)
        return linear(out, self.o_proj)


def _param(dtype: torch.dtype, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
