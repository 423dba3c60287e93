"""Attention on the core's matrix units: the AMX kernel of `csrc/cpu_attention_amx.cpp` over
a StageBatch.

Both products run on AMX tiles (bf16 in, fp32 accumulation) with the softmax between them in
AVX-512, online across keys: nothing of size [rows, context] is ever written to memory. The
K and V a chunk reads are copied once per layer and KV head from the paged cache into the
tiles' operand layouts; chunks whose block tables start with the same cached blocks (as
`cascade` finds them) share that copy, and each of their query blocks reads it in place. The
cache keeps its one layout ([slots, kv_heads, head_dim], what every other kernel, the
exporter and the decode side read).

The kernel runs bf16 queries and caches on a CPU with AMX-BF16 (and the kernel's permission to
use its tiles); `amx_applies` says whether it runs a given query. Elsewhere `paged_attention`
runs `chunked_cpp` in its place.
"""

from __future__ import annotations

import torch

from wavepp.models.batch import StageBatch
from wavepp.models.kernels import cpp

# Chunks share a cached prefix's copy from this many tokens on (the same rule as cascade).
MIN_SHARED_PREFIX_TOKENS = 64


def amx_applies(query: torch.Tensor) -> bool:
    """Whether the AMX kernel runs this query: bf16 on a CPU whose AMX tiles the kernel may
    use, the extension built."""
    return (
        query.device.type == "cpu"
        and query.dtype == torch.bfloat16
        and cpp.amx_attention_kernels() is not None
    )


def amx_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    batch: StageBatch,
    scale: float,
    *,
    keys_per_step: int = 0,
) -> torch.Tensor:
    """Causal attention of the batch's chunks over their contexts in the cache.

    query: [num_tokens, num_heads, head_dim]; key_cache: [num_slots, kv_heads, head_dim],
    value_cache: [num_slots, kv_heads, v_dim] (any strides but a contiguous last dim; a
    latent cache's views do). Returns [num_tokens, num_heads * v_dim] in bf16.
    keys_per_step: keys per online-softmax step (0: the kernel's default; small values make
    tests cross many steps)."""
    if not amx_applies(query):
        raise RuntimeError(
            "the AMX attention kernel runs bf16 CPU tensors on a CPU with AMX-BF16 only"
        )
    num_tokens, num_heads, _ = query.shape
    v_dim = value_cache.shape[2]
    indices = batch.memo("amx_indices", lambda: _indices(batch))
    out = torch.empty(num_tokens, num_heads, v_dim, dtype=torch.bfloat16)
    cpp.amx_attention_kernels().attention(
        query,
        key_cache,
        value_cache,
        batch.context_slots,
        *indices,
        float(scale),
        out,
        int(keys_per_step),
    )
    return out.view(num_tokens, num_heads * v_dim)


def _indices(batch: StageBatch) -> tuple[torch.Tensor, ...]:
    """The batch's index tensors as the kernel takes them (made once per wave, shared by every
    layer): token and context starts, cached counts, and the groups of chunks sharing a
    prefix (group_starts into members, each group's shared tokens; 0 for a chunk alone)."""
    shared = batch.shared_prefixes(MIN_SHARED_PREFIX_TOKENS)
    grouped = {i for members, _ in shared for i in members}
    groups = [(members, prefix) for members, prefix in shared]
    groups += [((i,), 0) for i in range(batch.num_chunks) if i not in grouped]
    starts, members, prefixes = [0], [], []
    for group, prefix in groups:
        members.extend(group)
        starts.append(len(members))
        prefixes.append(prefix)

    def longs(values) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64)

    return (
        longs(batch.token_starts),
        longs(batch.context_starts),
        longs(c.num_cached_tokens for c in batch.chunks),
        longs(starts),
        longs(members),
        longs(prefixes),
    )
