"""Causal self-attention of a batch of chunks over a paged KV cache.

Per layer: one fused q/k/v matmul over every token of the batch, RoPE, the new K/V written to
the cache at the batch's slot mapping, then each chunk attends over its whole context
[0, end) gathered from the cache with its block table, and one output matmul.

Grouped-query attention without repeating K/V: the G = num_heads / num_kv_heads query heads
of one KV head are stacked as rows of one matmul, so each KV head's keys are read once.
"""

from __future__ import annotations

import torch
from torch import nn

from wavepp.models.batch import StageBatch
from wavepp.models.config import ModelConfig
from wavepp.models.kernels import linear
from wavepp.models.layers import RMSNorm, apply_rotary

# Score tiles of at most about this many bytes stay in a core's L2 cache while softmax reads
# them (measured on one core: 1-2 MiB tiles run 1.3-1.6x faster than one untiled pass).
_SCORE_TILE_BYTES = 2 << 20
_MAX_TILE_ROWS = 128


class Attention(nn.Module):
    """q/k/v fused into one [q_size + 2 * kv_size, hidden] projection; optional biases and
    per-head q/k RMSNorm (Qwen3)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        qkv_size = config.q_size + 2 * config.kv_size
        self.qkv_proj = _param(dtype, qkv_size, config.hidden_size)
        self.qkv_bias = _param(dtype, qkv_size) if config.qkv_bias else None
        self.o_proj = _param(dtype, config.hidden_size, config.q_size)
        self.o_bias = _param(dtype, config.hidden_size) if config.o_bias else None
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: StageBatch,
                key_cache: torch.Tensor, value_cache: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, hidden] -> [num_tokens, hidden]. Writes the batch's K/V into
        key_cache/value_cache ([num_slots, num_kv_heads, head_dim]) at batch.slot_mapping."""
        num_tokens = x.shape[0]
        heads, kv_heads = self.num_heads, self.num_kv_heads
        # qkv: [num_tokens, heads + 2 * kv_heads, head_dim]  (q heads | k heads | v heads)
        qkv = linear(x, self.qkv_proj, self.qkv_bias).view(num_tokens, -1, self.head_dim)
        # q and k rotate together: qk: [num_tokens, heads + kv_heads, head_dim]
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qkv[:, :heads]), self.k_norm(qkv[:, heads:heads + kv_heads])), 1)
        else:
            qk = qkv[:, :heads + kv_heads]
        qk = apply_rotary(qk, cos, sin)
        # Each chunk's [0, num_cached) is in the cache already; its new tokens go in now, so that
        # attention reads the whole context [0, end) from one place.
        key_cache.index_copy_(0, batch.slot_mapping, qk[:, heads:])
        value_cache.index_copy_(0, batch.slot_mapping, qkv[:, heads + kv_heads:])
        out = paged_attention(qk[:, :heads], key_cache, value_cache, batch, self.scale)
        # out: [num_tokens, heads * head_dim] -> [num_tokens, hidden]
        return linear(out, self.o_proj, self.o_bias)


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    batch: StageBatch, scale: float) -> torch.Tensor:
    """Each chunk's queries attend causally over its context [0, end) read from the cache.

    query: [num_tokens, num_heads, head_dim]; key_cache, value_cache: [num_slots, num_kv_heads,
    head_dim] already holding the batch's new K/V. Returns [num_tokens, num_heads * head_dim].
    """
    num_tokens, num_heads, head_dim = query.shape
    kv_heads = key_cache.shape[1]
    group = num_heads // kv_heads
    # Scaling q once is cheaper than scaling every score (exact when head_dim is a power of 4).
    query = query * scale
    # out: [num_tokens, kv_heads, group, head_dim]; head h uses KV head h // group
    out = query.new_empty(num_tokens, kv_heads, group, head_dim)
    for index, chunk in enumerate(batch.chunks):
        t0, t1 = batch.token_starts[index], batch.token_starts[index + 1]
        c0, c1 = batch.context_starts[index], batch.context_starts[index + 1]
        context = batch.context_slots[c0:c1]
        # keys, values: [end, kv_heads, head_dim] -> [kv_heads, end, head_dim], made contiguous
        # once here so that the matmuls of every tile below read them in place
        keys = key_cache.index_select(0, context).transpose(0, 1).contiguous()
        values = value_cache.index_select(0, context).transpose(0, 1).contiguous()
        # queries: [kv_heads, group, chunk_tokens, head_dim]
        queries = query[t0:t1].view(-1, kv_heads, group, head_dim).permute(1, 2, 0, 3)
        _attend_chunk(queries, keys, values, chunk.num_cached_tokens,
                      batch.causal_bias(query.dtype), out[t0:t1])
    return out.view(num_tokens, num_heads * head_dim)


def _attend_chunk(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  num_cached: int, causal_bias: torch.Tensor, out: torch.Tensor) -> None:
    """Tiles of query rows, so that each tile's scores stay in cache through the softmax."""
    kv_heads, group, num_new, head_dim = queries.shape
    context_len = keys.shape[1]
    rows = _tile_rows(num_new, kv_heads * group * context_len * queries.element_size())
    for a in range(0, num_new, rows):
        b = min(num_new, a + rows)
        # Query rows [a, b) sit at positions num_cached + [a, b) and see context [0, seen):
        #   [0, num_cached)  cached prefix, all visible  |  [num_cached, seen)  causal
        seen = num_cached + b
        q_tile = queries[:, :, a:b].reshape(kv_heads, group * (b - a), head_dim)
        # scores: [kv_heads, group * (b - a), seen]
        scores = q_tile.new_empty(kv_heads, group * (b - a), seen)
        _matmul_heads(q_tile, keys[:, :seen].transpose(1, 2), scores)
        scores.view(kv_heads, group, b - a, seen)[..., num_cached:].add_(causal_bias[a:b, :b])
        probs = torch.softmax(scores, dim=-1)
        # tile_out: [kv_heads, group * (b - a), head_dim] -> out rows [a, b)
        tile_out = q_tile.new_empty(kv_heads, group * (b - a), head_dim)
        _matmul_heads(probs, values[:, :seen], tile_out)
        out[a:b] = tile_out.view(kv_heads, group, b - a, head_dim).permute(2, 0, 1, 3)


def _matmul_heads(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out[h] = a[h] @ b[h]. bmm copies an operand sliced out of a larger tensor (a tile of the
    context); per-head mm reads it in place."""
    if b.is_contiguous() or b.transpose(1, 2).is_contiguous():
        torch.bmm(a, b, out=out)
    else:
        for head in range(a.shape[0]):
            torch.mm(a[head], b[head], out=out[head])


def _tile_rows(num_new: int, row_bytes: int) -> int:
    # Tiles of at most _MAX_TILE_ROWS rows also skip most of the masked upper triangle.
    rows = _SCORE_TILE_BYTES // row_bytes // 16 * 16
    return min(num_new, max(16, min(_MAX_TILE_ROWS, rows)))


def _param(dtype: torch.dtype, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
