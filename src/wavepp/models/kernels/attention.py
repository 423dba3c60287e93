"""Causal attention of a batch of chunks over a paged KV cache: the CPU kernels.

Each chunk attends over its whole context [0, end) gathered from the cache with its block
table (the chunk's new K/V are written there first, by the layer). Grouped-query attention
without repeating K/V: the G = num_heads / num_kv_heads query heads of one KV head are
stacked as rows of one matmul, so each KV head's keys are read once.

Which kernel runs is the stage's `Kernels.attention` (`kernels/choice.py`), measured at stage
start-up: on an AMD EPYC without AMX the chunked kernel ran 1.7-2x faster than SDPA's
flash-attention CPU kernel in bf16, while on a Xeon with AMX SDPA measured the faster. On CUDA
nothing is timed: `varlen` (`kernels/attention_torch.py`) where it applies, else `sdpa`. Every
kernel runs on the device of its inputs; every tensor it makes follows them.
"""

from __future__ import annotations

import torch

from wavepp.models.batch import StageBatch
from wavepp.models.kernels import cpp
from wavepp.models.kernels.attention_amx import amx_applies, amx_attention
from wavepp.models.kernels.attention_torch import sdpa_attention, varlen_attention

# Score tiles of at most about this many bytes stay in a core's L2 cache while softmax reads
# them (measured on one core: 1-2 MiB tiles run 1.3-1.6x faster than one untiled pass).
_SCORE_TILE_BYTES = 2 << 20
_MAX_TILE_ROWS = 128
# Chunks share a prefix for cascade attention from this many cached tokens on (a block or two
# of shared keys is not worth a second pass and a merge).
MIN_SHARED_PREFIX_TOKENS = 64
ATTENTION_KERNELS = (
    "chunked",
    "cascade",
    "sdpa",
    "chunked_cpp",
    "cascade_cpp",
    "amx",
)  # timed on a CPU
CUDA_ATTENTION_KERNELS = ("varlen",)  # kernels with no CPU implementation
ALL_ATTENTION_KERNELS = ATTENTION_KERNELS + CUDA_ATTENTION_KERNELS


def check_attention(kernel: str) -> str:
    if kernel not in ALL_ATTENTION_KERNELS:
        raise ValueError(
            f"unknown attention kernel {kernel!r}; choose one of {', '.join(ALL_ATTENTION_KERNELS)}"
        )
    return kernel


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    batch: StageBatch,
    scale: float,
    *,
    kernel: str = "chunked",
) -> torch.Tensor:
    """Each chunk's queries attend causally over its context [0, end) read from the cache.

    query: [num_tokens, num_heads, head_dim]; key_cache, value_cache: [num_slots, num_kv_heads,
    head_dim] already holding the batch's new K/V. Returns [num_tokens, num_heads * head_dim].

    `kernel`, one of ALL_ATTENTION_KERNELS:

        chunked  chunk by chunk, rows in tiles whose scores stay in cache; grouped-query heads
                 stacked as rows of one matmul per KV head
        cascade  chunks that read the same cached prefix blocks (requests sharing a system
                 prompt or a document) attend to that prefix together: their queries stacked
                 into one matmul against the prefix's keys and values, gathered once, then
                 merged with each chunk's own part by log-sum-exp; other chunks as `chunked`
        chunked_cpp, cascade_cpp
                 the same with the softmax (and its causal mask) in the C++ CPU kernel of
                 `kernels/cpp.py` where it runs (CPU, fp32 or bf16, the extension built), else
                 with torch's: exp by a vectorized polynomial instead of torch's exp
        amx      both products on AMX tiles with an online softmax between them, K/V copied
                 once per chunk (once per shared prefix) into the tiles' layouts
                 (`kernels/attention_amx.py`); bf16 on a CPU with AMX-BF16, else `chunked_cpp`
        sdpa     chunk by chunk with F.scaled_dot_product_attention (PyTorch's fused
                 flash-attention CPU kernel: bf16 in, fp32 accumulation; on CUDA its
                 memory-efficient kernel), a visibility mask
        varlen   CUDA only: every chunk in one call of torch.nn.attention.varlen (FlashAttention
                 over the packed contexts, bf16 / fp16)
    """
    check_attention(kernel)
    if kernel == "amx":
        if amx_applies(query):
            return amx_attention(query, key_cache, value_cache, batch, scale)
        kernel = "chunked_cpp"
    # chunked_cpp / cascade_cpp: chunked / cascade with the C++ softmax where it runs (a CPU
    # tensor in fp32 or bf16, the extension built), else with torch's
    fast = kernel.endswith("_cpp") and _fast_softmax_applies(query)
    kernel = kernel.removesuffix("_cpp")
    if kernel == "sdpa":
        return sdpa_attention(query, key_cache, value_cache, batch, scale)
    if kernel == "varlen":
        return varlen_attention(query, key_cache, value_cache, batch, scale)
    num_tokens, num_heads, head_dim = query.shape
    kv_heads = key_cache.shape[1]
    group = num_heads // kv_heads
    # Scaling q once is cheaper than scaling every score (exact when head_dim is a power of 4).
    query = query * scale
    # out: [num_tokens, kv_heads, group, head_dim]; head h uses KV head h // group
    out = query.new_empty(num_tokens, kv_heads, group, head_dim)
    bias = None if fast else batch.causal_bias(query.dtype)
    shared = batch.shared_prefixes(MIN_SHARED_PREFIX_TOKENS) if kernel == "cascade" else []
    for members, prefix in shared:
        _attend_shared_prefix(
            query, key_cache, value_cache, batch, members, prefix, bias, out, fast
        )
    grouped = {i for members, _ in shared for i in members}
    for index, chunk in enumerate(batch.chunks):
        if index in grouped:
            continue
        t0, t1 = batch.token_starts[index], batch.token_starts[index + 1]
        c0, c1 = batch.context_starts[index], batch.context_starts[index + 1]
        keys, values = _gather(key_cache, value_cache, batch.context_slots[c0:c1])
        _attend_chunk(
            _heads_major(query[t0:t1], kv_heads),
            keys,
            values,
            chunk.num_cached_tokens,
            bias,
            out[t0:t1],
            fast,
        )
    return out.view(num_tokens, num_heads * head_dim)


def _attend_shared_prefix(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    batch: StageBatch,
    members: tuple[int, ...],
    prefix: int,
    causal_bias: torch.Tensor | None,
    out: torch.Tensor,
    fast: bool,
) -> None:
    """Cascade attention of the chunks `members`, which all hold [0, prefix) cached in the same
    blocks:

        member i:  [0, prefix)  shared: one matmul for every member's queries
                   [prefix, num_cached_i)  its own cached part  |  [num_cached_i, end_i)  causal

    Each part gives an unnormalized output with its row max and sum; the two merge exactly."""
    kv_heads, group, head_dim = out.shape[1:]
    c0 = batch.context_starts[members[0]]
    keys, values = _gather(key_cache, value_cache, batch.context_slots[c0 : c0 + prefix])
    spans = [(batch.token_starts[i], batch.token_starts[i + 1]) for i in members]
    rows = torch.cat([torch.arange(t0, t1, device=query.device) for t0, t1 in spans])
    # queries: [kv_heads, group, n, head_dim], n = the members' tokens side by side
    queries = _heads_major(query.index_select(0, rows), kv_heads)
    n = rows.numel()
    shared_out, shared_max, shared_sum = _partial_attention(
        queries.reshape(kv_heads, group * n, head_dim), keys, values, fast=fast
    )
    shared_out = shared_out.view(kv_heads, group, n, head_dim)
    shared_max, shared_sum = (
        shared_max.view(kv_heads, group, n),
        shared_sum.view(kv_heads, group, n),
    )
    offset = 0
    for index, (t0, t1) in zip(members, spans):
        _chunk, num_new = batch.chunks[index], t1 - t0
        c0, c1 = batch.context_starts[index], batch.context_starts[index + 1]
        own_keys, own_values = _gather(
            key_cache, value_cache, batch.context_slots[c0 + prefix : c1]
        )
        # keys [prefix, end): [prefix, num_cached) visible | [num_cached, end) causal
        own_out, own_max, own_sum = _partial_attention(
            queries[:, :, offset : offset + num_new].reshape(kv_heads, group * num_new, head_dim),
            own_keys,
            own_values,
            num_new,
            causal_bias,
            fast,
        )
        rows_of = slice(offset, offset + num_new)
        merged = _merge(
            shared_out[:, :, rows_of],
            shared_max[:, :, rows_of],
            shared_sum[:, :, rows_of],
            own_out.view(kv_heads, group, num_new, head_dim),
            own_max.view(kv_heads, group, num_new),
            own_sum.view(kv_heads, group, num_new),
        )
        out[t0:t1] = merged.permute(2, 0, 1, 3).to(out.dtype)
        offset += num_new


def _partial_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    causal_rows: int = 0,
    causal_bias: torch.Tensor | None = None,
    fast: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax attention left unnormalized, for merging: queries [kv_heads, r, head_dim] over
    keys/values [kv_heads, L, head_dim]. causal_rows = n > 0: r = group * n rows, row i of each
    group (position L - n + i) sees keys [0, L - n + i] (`causal_bias`, the batch's, masks them
    on torch's path); n = 0: every row sees every key. Returns (sum_j exp(s_j - m) v_j, m,
    sum_j exp(s_j - m)) in fp32: [kv_heads, r, head_dim], [kv_heads, r], [kv_heads, r]. Rows
    in tiles, so each tile's scores stay in cache. fast: the C++ softmax."""
    kv_heads, r, head_dim = queries.shape
    length = keys.shape[1]
    out = torch.empty(kv_heads, r, head_dim, dtype=torch.float32, device=queries.device)
    row_max = torch.empty(kv_heads, r, dtype=torch.float32, device=queries.device)
    row_sum = torch.empty(kv_heads, r, dtype=torch.float32, device=queries.device)
    bias = None
    if causal_rows and not fast:
        # bias: [n, L]: [0, L - n) visible | [L - n, L) causal
        bias = causal_bias.new_zeros(causal_rows, length)
        bias[:, length - causal_rows :] = causal_bias[:causal_rows, :causal_rows]
    tile = r if causal_rows else _tile_rows(r, kv_heads * length * 4)
    for a in range(0, r, tile):
        b = min(r, a + tile)
        # scores: [kv_heads, b - a, L], in the model's dtype like the chunk-by-chunk softmax
        scores = torch.bmm(queries[:, a:b], keys.transpose(1, 2))
        if fast:
            cpp.softmax_unnormalized_(scores, causal_rows, row_max[:, a:b], row_sum[:, a:b])
            probs = scores
        else:
            if bias is not None:
                scores.view(kv_heads, -1, causal_rows, length).add_(bias)
            m = scores.amax(-1, keepdim=True)
            probs = scores.sub_(m).exp_()
            row_max[:, a:b] = m.squeeze(-1)
            row_sum[:, a:b] = probs.sum(-1, dtype=torch.float32)
        out[:, a:b] = torch.bmm(probs, values)
    return out, row_max, row_sum


def _merge(out_a, max_a, sum_a, out_b, max_b, sum_b) -> torch.Tensor:
    """Two unnormalized parts of one softmax over disjoint keys -> the normalized output."""
    m = torch.maximum(max_a, max_b)
    wa, wb = torch.exp(max_a - m), torch.exp(max_b - m)
    return (out_a * wa[..., None] + out_b * wb[..., None]) / (sum_a * wa + sum_b * wb)[..., None]


def _gather(key_cache: torch.Tensor, value_cache: torch.Tensor, slots: torch.Tensor):
    """keys, values of `slots`: [len, kv_heads, head_dim] -> [kv_heads, len, head_dim], made
    contiguous once so that every matmul below reads them in place."""
    return (
        key_cache.index_select(0, slots).transpose(0, 1).contiguous(),
        value_cache.index_select(0, slots).transpose(0, 1).contiguous(),
    )


def _heads_major(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[tokens, heads, head_dim] -> [kv_heads, group, tokens, head_dim] (a view)."""
    tokens, heads, head_dim = query.shape
    return query.view(tokens, kv_heads, heads // kv_heads, head_dim).permute(1, 2, 0, 3)


def _attend_chunk(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    num_cached: int,
    causal_bias: torch.Tensor | None,
    out: torch.Tensor,
    fast: bool = False,
) -> None:
    """Tiles of query rows, so that each tile's scores stay in cache through the softmax.
    fast: the C++ softmax masks each tile itself (causal_bias unused)."""
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
        if fast:  # row i of each head's b - a rows sees [0, seen - (b - a) + i]
            cpp.softmax_(scores, b - a)
            probs = scores
        else:
            scores.view(kv_heads, group, b - a, seen)[..., num_cached:].add_(causal_bias[a:b, :b])
            probs = torch.softmax(scores, dim=-1)
        # tile_out: [kv_heads, group * (b - a), head_dim] -> out rows [a, b)
        tile_out = q_tile.new_empty(kv_heads, group * (b - a), head_dim)
        _matmul_heads(probs, values[:, :seen], tile_out)
        out[a:b] = tile_out.view(kv_heads, group, b - a, head_dim).permute(2, 0, 1, 3)


def _fast_softmax_applies(query: torch.Tensor) -> bool:
    return (
        query.device.type == "cpu"
        and query.dtype in (torch.float32, torch.bfloat16)
        and cpp.softmax_kernels() is not None
    )


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
