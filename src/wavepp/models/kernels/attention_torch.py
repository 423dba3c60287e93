"""Attention through torch's own kernels: SDPA chunk by chunk (CPU or CUDA), and varlen
FlashAttention over every chunk of a wave at once (CUDA only)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wavepp.models.batch import StageBatch

try:  # variable-length FlashAttention (torch >= 2.10); CUDA kernels only
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # pragma: no cover - the pinned torch has it
    _varlen_attn = None


def varlen_applies(head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether torch's varlen FlashAttention runs these heads on `device`: this torch has it,
    a CUDA device of compute capability 8.0 or later (FlashAttention-2), bf16 or fp16, and a
    head_dim that is a multiple of 8 up to 256."""
    return (
        _varlen_attn is not None
        and device.type == "cuda"
        and dtype in (torch.bfloat16, torch.float16)
        and head_dim % 8 == 0
        and head_dim <= 256
        and torch.cuda.get_device_capability(device) >= (8, 0)
    )


def varlen_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    batch: StageBatch,
    scale: float,
) -> torch.Tensor:
    """Every chunk in one varlen FlashAttention call over the chunks' contexts, packed:

        queries  [num_tokens, heads, head_dim]    chunk i at rows cu_tokens[i]:cu_tokens[i+1]
        keys     [sum of ends, kv_heads, hd]      chunk i at rows cu_context[i]:cu_context[i+1]

    Its causal mask is aligned to the bottom right of each chunk's (new x end) score block: new
    token r of a chunk with C cached tokens (position C + r) sees keys [0, C + r], as in every
    other kernel here. Grouped-query heads by `enable_gqa` (K/V not repeated)."""
    if _varlen_attn is None or query.device.type == "cpu":
        raise ValueError(
            "the varlen attention kernel runs on CUDA only (torch.nn.attention.varlen); "
            f"these tensors are on {query.device}"
        )
    num_tokens, num_heads, head_dim = query.shape
    args, kwargs = varlen_operands(query, key_cache, value_cache, batch, scale)
    return _varlen_attn(*args, **kwargs).reshape(num_tokens, num_heads * head_dim)


def varlen_operands(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    batch: StageBatch,
    scale: float,
) -> tuple[tuple, dict]:
    """The arguments of the varlen call (`varlen_attn(*args, **kwargs)`), apart so that the
    packing is checked on any device: (query, keys, values, cu_seq_q, cu_seq_k, max_q, max_k),
    then scale, a causal window and grouped-query heads."""
    # keys, values: [sum of chunk ends, kv_heads, head_dim], gathered in context order
    keys = key_cache.index_select(0, batch.context_slots)
    values = value_cache.index_select(0, batch.context_slots)
    # window (-1, 0): causal; max_k is the longest context (max_position + 1)
    args = (
        query.contiguous(),
        keys,
        values,
        batch.cu_tokens,
        batch.cu_context,
        batch.max_chunk_tokens,
        batch.max_position + 1,
    )
    return args, {"scale": scale, "window_size": (-1, 0), "enable_gqa": True}


def sdpa_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    batch: StageBatch,
    scale: float,
) -> torch.Tensor:
    """Chunk by chunk through F.scaled_dot_product_attention: grouped-query heads by
    `enable_gqa` (K/V not repeated), K/V read as strided views of the gathered rows (the
    kernel takes strides, so no transposing copy)."""
    num_tokens, num_heads, head_dim = query.shape
    out = query.new_empty(num_tokens, num_heads, head_dim)
    for index, chunk in enumerate(batch.chunks):
        t0, t1 = batch.token_starts[index], batch.token_starts[index + 1]
        c0, c1 = batch.context_starts[index], batch.context_starts[index + 1]
        slots = batch.context_slots[c0:c1]
        # keys, values: [context, kv_heads, head_dim] -> [1, kv_heads, context, head_dim] views
        keys = key_cache.index_select(0, slots).permute(1, 0, 2).unsqueeze(0)
        values = value_cache.index_select(0, slots).permute(1, 0, 2).unsqueeze(0)
        # q: [num_new, heads, head_dim] -> [1, heads, num_new, head_dim]; one token sees all
        q = query[t0:t1].permute(1, 0, 2).unsqueeze(0)
        mask = batch.visible_mask(index) if chunk.num_tokens > 1 else None
        result = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
        )
        out[t0:t1] = result[0].transpose(0, 1)
    return out.view(num_tokens, num_heads * head_dim)


def shared_kv_sdpa(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One chunk's attention over one KV head that every query head shares (MLA's latent
    form: the keys are the latent rows with their RoPE part, the values the latents), by
    F.scaled_dot_product_attention with an explicit mask:

        query [m, heads, d], keys [L, d], values [L, dv], visible [m, L] bool -> [m, heads, dv]

    The shared head is an expanded view (stride 0 over heads), no copy per head, rather than
    `enable_gqa`, which not every SDPA kernel takes; with a mask and a head_dim past
    FlashAttention's 256 (576 for DeepSeek-V3's) SDPA picks among its other kernels (the
    memory-efficient one takes both; not measured on a GPU). `visible` broadcasts over the
    heads: causal, and a DSA selection where there is one."""
    m, heads, _ = query.shape
    # q: [1, heads, m, d]; k, v: [1, heads, L, d | dv] views of the one head
    q = query.transpose(0, 1).unsqueeze(0)
    k = keys.unsqueeze(0).unsqueeze(0).expand(1, heads, *keys.shape)
    v = values.unsqueeze(0).unsqueeze(0).expand(1, heads, *values.shape)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible[None, None], scale=scale)
    return out[0].transpose(0, 1)
