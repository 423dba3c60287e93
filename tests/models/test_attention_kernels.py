"""Every attention kernel equals a straightforward reference attention.

The reference: per chunk, every query head against its KV head's keys [0, end) of the chunk's
context in float64, scores masked where a key lies after the query's position, softmax, times
values. In fp32 every kernel must match it within 2e-6 (the kernels differ only in summation
order and in where the scale is applied); in bf16 within 2e-2 (bf16 inputs and scores, fp32 or
bf16 accumulation).
"""

import random

import pytest
import torch

from wavepp.models.batch import ChunkSpec, StageBatch
from wavepp.models.kernels import ATTENTION_KERNELS, paged_attention

BS = 16


def reference(query, key_cache, value_cache, batch, scale):
    kv_heads = key_cache.shape[1]
    num_tokens, num_heads, head_dim = query.shape
    group = num_heads // kv_heads
    out = torch.empty(num_tokens, num_heads * head_dim, dtype=torch.float64)
    for i, chunk in enumerate(batch.chunks):
        t0, t1 = batch.token_starts[i], batch.token_starts[i + 1]
        ctx = batch.context_slots[batch.context_starts[i] : batch.context_starts[i + 1]]
        k, v = key_cache[ctx].double(), value_cache[ctx].double()
        q = query[t0:t1].double().view(t1 - t0, kv_heads, group, head_dim)
        scores = torch.einsum("nkgd,lkd->nkgl", q, k) * scale
        positions = torch.arange(chunk.num_cached_tokens, chunk.end)
        hidden = torch.arange(chunk.end)[None, :] > positions[:, None]  # [n, end]
        scores = scores.masked_fill(hidden[:, None, None, :], float("-inf"))
        out[t0:t1] = torch.einsum("nkgl,lkd->nkgd", scores.softmax(-1), v).reshape(t1 - t0, -1)
    return out


def random_wave(rng, specs, kv_heads, group, head_dim, dtype):
    """specs: (num_cached, num_new) per chunk, each on its own shuffled blocks."""
    blocks = list(range(sum(-(-(c + n) // BS) for c, n in specs)))
    rng.shuffle(blocks)  # a fragmented pool
    chunks, at = [], 0
    for index, (cached, new) in enumerate(specs):
        need = -(-(cached + new) // BS)
        chunks.append(ChunkSpec(cached, new, tuple(blocks[at : at + need]), index))
        at += need
    batch = StageBatch.build(chunks, BS)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    slots = len(blocks) * BS
    key_cache = torch.randn(slots, kv_heads, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(slots, kv_heads, head_dim, generator=gen).to(dtype)
    query = torch.randn(batch.num_tokens, kv_heads * group, head_dim, generator=gen).to(dtype)
    return batch, query, key_cache, value_cache


WAVES = {
    "one-token chunks": [(0, 1), (1, 1), (37, 1), (1536, 1)],
    "after long prefixes": [(1536, 64), (1536, 256), (2048, 17)],
    "mixed lengths": [(0, 50), (16, 1), (100, 33), (512, 128), (3, 200)],
    "cold": [(0, 300)],
}


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
@pytest.mark.parametrize("wave", WAVES)
@pytest.mark.parametrize(
    "heads", [(3, 3, 64), (2, 1, 16), (1, 4, 32)]
)  # (kv_heads, group, head_dim)
def test_kernel_equals_reference_fp32(kernel, wave, heads):
    kv_heads, group, head_dim = heads
    rng = random.Random(f"{kernel}{wave}{heads}")
    batch, query, key_cache, value_cache = random_wave(
        rng, WAVES[wave], kv_heads, group, head_dim, torch.float32
    )
    scale = head_dim**-0.5
    out = paged_attention(query, key_cache, value_cache, batch, scale, kernel=kernel)
    assert (
        out.shape == (batch.num_tokens, kv_heads * group * head_dim) and out.dtype == torch.float32
    )
    torch.testing.assert_close(
        out.double(), reference(query, key_cache, value_cache, batch, scale), rtol=0, atol=2e-6
    )


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_kernel_equals_reference_bf16(kernel):
    rng = random.Random(kernel)
    batch, query, key_cache, value_cache = random_wave(
        rng, [(1536, 64), (1536, 1), (0, 40), (700, 129)], 3, 3, 64, torch.bfloat16
    )
    out = paged_attention(query, key_cache, value_cache, batch, 0.125, kernel=kernel)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.double(), reference(query, key_cache, value_cache, batch, 0.125), rtol=0, atol=2e-2
    )


def test_unknown_kernel_is_refused():
    rng = random.Random(0)
    batch, query, key_cache, value_cache = random_wave(rng, [(0, 4)], 1, 1, 8, torch.float32)
    with pytest.raises(ValueError, match="unknown attention kernel 'flash'"):
        paged_attention(query, key_cache, value_cache, batch, 1.0, kernel="flash")
