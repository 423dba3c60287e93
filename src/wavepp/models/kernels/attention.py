"""Causal self-attention of a batch of chunks over a paged KV cache.

Per layer: one fused q/k/v matmul over every token of the batch, RoPE, the new K/V written to
the cache at the batch's slot mapping, then each chunk attends over its whole context
[0, end) gathered from the cache with its block table, and one output matmul.

Grouped-query attention without repeating K/V: the G = num_heads / num_kv_heads query heads
of one KV head are stacked as rows of one matmul, so each KV head's keys are read once.

Which attention kernel runs (chunked, cascade or PyTorch's SDPA; the first two also with the
softmax in a C++ kernel, `cpu_kernels`) is measured at stage start-up (`choose_attention`), as
the projections' path is: on an AMD EPYC without AMX the chunked kernel ran 1.7-2x faster than
SDPA's flash-attention CPU kernel in bf16, while on a Xeon with AMX SDPA measured the faster. On CUDA nothing is timed: `varlen` (every chunk in one call of
torch's variable-length FlashAttention) where it applies, else `sdpa`. Every kernel runs on the
device of its inputs; every tensor it makes follows them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from wavepp.models import cpu_kernels
from wavepp.models.batch import ChunkSpec, StageBatch
from wavepp.models.config import ModelConfig
from wavepp.models.kernels import linear
from wavepp.models.layers import RMSNorm, apply_rotary

try:   # variable-length FlashAttention (torch >= 2.10); CUDA kernels only
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:   # pragma: no cover - the pinned torch has it
    _varlen_attn = None

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
                    batch: StageBatch, scale: float, *, kernel: str | None = None) -> torch.Tensor:
    """Each chunk's queries attend causally over its context [0, end) read from the cache.

    query: [num_tokens, num_heads, head_dim]; key_cache, value_cache: [num_slots, num_kv_heads,
    head_dim] already holding the batch's new K/V. Returns [num_tokens, num_heads * head_dim].

    `kernel` (one of ATTENTION_KERNELS; None: this process's measured choice, see
    `choose_attention`):

        chunked  chunk by chunk, rows in tiles whose scores stay in cache; grouped-query heads
                 stacked as rows of one matmul per KV head
        cascade  chunks that read the same cached prefix blocks (requests sharing a system
                 prompt or a document) attend to that prefix together: their queries stacked
                 into one matmul against the prefix's keys and values, gathered once, then
                 merged with each chunk's own part by log-sum-exp; other chunks as `chunked`
        chunked_cpp, cascade_cpp
                 the same with the softmax (and its causal mask) in the C++ CPU kernel of
                 `cpu_kernels` where it runs (CPU, fp32 or bf16, the extension built), else
                 with torch's: exp by a vectorized polynomial instead of torch's exp
        sdpa     chunk by chunk with F.scaled_dot_product_attention (PyTorch's fused
                 flash-attention CPU kernel: bf16 in, fp32 accumulation; on CUDA its
                 memory-efficient kernel), a visibility mask
        varlen   CUDA only: every chunk in one call of torch.nn.attention.varlen (FlashAttention
                 over the packed contexts, bf16 / fp16)
    """
    kernel = _attention_kernel if kernel is None else kernel
    if kernel not in _ALL_KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; choose one of {', '.join(_ALL_KERNELS)}")
    # chunked_cpp / cascade_cpp: chunked / cascade with the C++ softmax where it runs (a CPU
    # tensor in fp32 or bf16, the extension built), else with torch's
    fast = kernel.endswith("_cpp") and _fast_softmax_applies(query)
    kernel = kernel.removesuffix("_cpp")
    if kernel == "sdpa":
        return _sdpa_attention(query, key_cache, value_cache, batch, scale)
    if kernel == "varlen":
        return _varlen_attention(query, key_cache, value_cache, batch, scale)
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
        _attend_shared_prefix(query, key_cache, value_cache, batch, members, prefix, bias, out, fast)
    grouped = {i for members, _ in shared for i in members}
    for index, chunk in enumerate(batch.chunks):
        if index in grouped:
            continue
        t0, t1 = batch.token_starts[index], batch.token_starts[index + 1]
        c0, c1 = batch.context_starts[index], batch.context_starts[index + 1]
        keys, values = _gather(key_cache, value_cache, batch.context_slots[c0:c1])
        _attend_chunk(_heads_major(query[t0:t1], kv_heads), keys, values, chunk.num_cached_tokens,
                      bias, out[t0:t1], fast)
    return out.view(num_tokens, num_heads * head_dim)


# Chunks share a prefix for cascade attention from this many cached tokens on (a block or two
# of shared keys is not worth a second pass and a merge).
MIN_SHARED_PREFIX_TOKENS = 64
ATTENTION_KERNELS = ("chunked", "cascade", "sdpa", "chunked_cpp", "cascade_cpp")   # timed on a CPU
CUDA_ATTENTION_KERNELS = ("varlen",)                 # kernels with no CPU implementation
_ALL_KERNELS = ATTENTION_KERNELS + CUDA_ATTENTION_KERNELS
_attention_kernel = "chunked"


def use_attention(kernel: str) -> None:
    global _attention_kernel
    if kernel not in _ALL_KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; choose one of {', '.join(_ALL_KERNELS)}")
    _attention_kernel = kernel


def attention_kernel() -> str:
    return _attention_kernel


@dataclass(frozen=True)
class AttentionChoice:
    name: str                        # the kernel now in use
    seconds: dict[str, float]        # each kernel's fastest seconds on the timing wave
    gflops: dict[str, float]         # the same as GFLOP/s (q.k and p.v over visible keys)


def choose_attention(kv_heads: int, group: int, head_dim: int, dtype: torch.dtype, *, trials: int = 5,
                     margin: float = 1.05, device: torch.device | str = "cpu") -> AttentionChoice:
    """Time every attention kernel, interleaved trial by trial (each kept at its fastest), on
    a wave like those of prefix-reuse workloads (4 chunks of 64 new tokens after a shared
    1,024-token prefix) with this model's heads, and use the fastest. `chunked` is the default: another kernel replaces
    it only if at least `margin` times faster (a noisy neighbour should not flip the choice).
    Takes about 0.3 s for SmolLM2's heads (`cpu_attention_kernels`, five trials; the first
    round in a process ran up to 10% off, hence more than three), and the first time on a
    machine the C++ softmax's build (about 30 s). `WAVEPP_ATTENTION_KERNEL` (one of
    ATTENTION_KERNELS, or varlen on CUDA) skips the timing and uses that kernel.

    On a CUDA `device` nothing is timed (the candidates above are CPU kernels): `varlen` where
    `varlen_applies`, else `sdpa`."""
    device = torch.device(device)
    pinned = os.environ.get("WAVEPP_ATTENTION_KERNEL")
    if pinned:
        if pinned in CUDA_ATTENTION_KERNELS and device.type != "cuda":
            raise ValueError(f"WAVEPP_ATTENTION_KERNEL={pinned} runs on CUDA only; this stage runs on {device}")
        use_attention(pinned)
        return AttentionChoice(pinned, {}, {})
    if device.type == "cuda":
        name = "varlen" if varlen_applies(head_dim, dtype, device) else "sdpa"
        use_attention(name)
        return AttentionChoice(name, {}, {})
    block_size, prefix, new = 16, 1024, 64
    shared = tuple(range(prefix // block_size))
    chunks = [ChunkSpec(prefix, new, shared + tuple(range(100 + 4 * i, 104 + 4 * i)), i) for i in range(4)]
    batch = StageBatch.build(chunks, block_size)
    gen = torch.Generator().manual_seed(0)
    num_slots = (100 + 16) * block_size
    key_cache = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    query = torch.randn(batch.num_tokens, kv_heads * group, head_dim, generator=gen).to(dtype)
    times: dict[str, list[float]] = {kernel: [] for kernel in cpu_attention_kernels(dtype)}
    for trial in range(trials + 1):              # the first round warms up
        for kernel in times:
            start = time.perf_counter()
            paged_attention(query, key_cache, value_cache, batch, head_dim ** -0.5, kernel=kernel)
            if trial:
                times[kernel].append(time.perf_counter() - start)
    # the fastest of the trials: a neighbour taking the core only adds time, and a choice
    # flipped by noise would change the numerics of every later wave in this process
    seconds = {kernel: min(t) for kernel, t in times.items()}
    flops = attention_flops(kv_heads * group, head_dim, [(c.num_cached_tokens, c.num_tokens) for c in chunks])
    best = min(seconds, key=seconds.get)
    if seconds["chunked"] < margin * seconds[best]:
        best = "chunked"
    use_attention(best)
    return AttentionChoice(best, seconds, {kernel: flops / s / 1e9 for kernel, s in seconds.items()})


def cpu_attention_kernels(dtype: torch.dtype) -> tuple[str, ...]:
    """The kernels `choose_attention` times on a CPU: ATTENTION_KERNELS, less those with the
    C++ softmax where it does not run (another dtype than fp32 / bf16, or the extension could
    not be built on this machine; building it the first time takes about half a minute)."""
    fast = dtype in (torch.float32, torch.bfloat16) and cpu_kernels.softmax_kernels() is not None
    return tuple(k for k in ATTENTION_KERNELS if fast or not k.endswith("_cpp"))


def attention_flops(num_heads: int, head_dim: int, chunks: list[tuple[int, int]]) -> float:
    """FLOPs of one layer's attention over chunks of (num_cached, num_new) tokens: q.k and p.v,
    2 * head_dim each, per head and per visible (query, key) pair."""
    visible = sum(new * cached + new * (new + 1) / 2 for cached, new in chunks)
    return 4.0 * num_heads * head_dim * visible


def varlen_applies(head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether torch's varlen FlashAttention runs these heads on `device`: this torch has it,
    a CUDA device of compute capability 8.0 or later (FlashAttention-2), bf16 or fp16, and a
    head_dim that is a multiple of 8 up to 256."""
    return (_varlen_attn is not None and device.type == "cuda"
            and dtype in (torch.bfloat16, torch.float16) and head_dim % 8 == 0 and head_dim <= 256
            and torch.cuda.get_device_capability(device) >= (8, 0))


def _varlen_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      batch: StageBatch, scale: float) -> torch.Tensor:
    """Every chunk in one varlen FlashAttention call over the chunks' contexts, packed:

        queries  [num_tokens, heads, head_dim]    chunk i at rows cu_tokens[i]:cu_tokens[i+1]
        keys     [sum of ends, kv_heads, hd]      chunk i at rows cu_context[i]:cu_context[i+1]

    Its causal mask is aligned to the bottom right of each chunk's (new x end) score block: new
    token r of a chunk with C cached tokens (position C + r) sees keys [0, C + r], as in every
    other kernel here. Grouped-query heads by `enable_gqa` (K/V not repeated)."""
    if _varlen_attn is None or query.device.type == "cpu":
        raise ValueError("the varlen attention kernel runs on CUDA only (torch.nn.attention.varlen); "
                         f"these tensors are on {query.device}")
    num_tokens, num_heads, head_dim = query.shape
    args, kwargs = varlen_operands(query, key_cache, value_cache, batch, scale)
    return _varlen_attn(*args, **kwargs).reshape(num_tokens, num_heads * head_dim)


def varlen_operands(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    batch: StageBatch, scale: float) -> tuple[tuple, dict]:
    """The arguments of the varlen call (`varlen_attn(*args, **kwargs)`), apart so that the
    packing is checked on any device: (query, keys, values, cu_seq_q, cu_seq_k, max_q, max_k),
    then scale, a causal window and grouped-query heads."""
    # keys, values: [sum of chunk ends, kv_heads, head_dim], gathered in context order
    keys = key_cache.index_select(0, batch.context_slots)
    values = value_cache.index_select(0, batch.context_slots)
    # window (-1, 0): causal; max_k is the longest context (max_position + 1)
    args = (query.contiguous(), keys, values, batch.cu_tokens, batch.cu_context,
            batch.max_chunk_tokens, batch.max_position + 1)
    return args, {"scale": scale, "window_size": (-1, 0), "enable_gqa": True}


def _sdpa_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    batch: StageBatch, scale: float) -> torch.Tensor:
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
        result = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
        out[t0:t1] = result[0].transpose(0, 1)
    return out.view(num_tokens, num_heads * head_dim)


def _attend_shared_prefix(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                          batch: StageBatch, members: tuple[int, ...], prefix: int,
                          causal_bias: torch.Tensor | None, out: torch.Tensor, fast: bool) -> None:
    """Cascade attention of the chunks `members`, which all hold [0, prefix) cached in the same
    blocks:

        member i:  [0, prefix)  shared: one matmul for every member's queries
                   [prefix, num_cached_i)  its own cached part  |  [num_cached_i, end_i)  causal

    Each part gives an unnormalized output with its row max and sum; the two merge exactly."""
    kv_heads, group, head_dim = out.shape[1:]
    c0 = batch.context_starts[members[0]]
    keys, values = _gather(key_cache, value_cache, batch.context_slots[c0:c0 + prefix])
    spans = [(batch.token_starts[i], batch.token_starts[i + 1]) for i in members]
    rows = torch.cat([torch.arange(t0, t1, device=query.device) for t0, t1 in spans])
    # queries: [kv_heads, group, n, head_dim], n = the members' tokens side by side
    queries = _heads_major(query.index_select(0, rows), kv_heads)
    n = rows.numel()
    shared_out, shared_max, shared_sum = _partial_attention(queries.reshape(kv_heads, group * n, head_dim),
                                                            keys, values, fast=fast)
    shared_out = shared_out.view(kv_heads, group, n, head_dim)
    shared_max, shared_sum = shared_max.view(kv_heads, group, n), shared_sum.view(kv_heads, group, n)
    offset = 0
    for index, (t0, t1) in zip(members, spans):
        chunk, num_new = batch.chunks[index], t1 - t0
        c0, c1 = batch.context_starts[index], batch.context_starts[index + 1]
        own_keys, own_values = _gather(key_cache, value_cache, batch.context_slots[c0 + prefix:c1])
        # keys [prefix, end): [prefix, num_cached) visible | [num_cached, end) causal
        own_out, own_max, own_sum = _partial_attention(
            queries[:, :, offset:offset + num_new].reshape(kv_heads, group * num_new, head_dim),
            own_keys, own_values, num_new, causal_bias, fast)
        rows_of = slice(offset, offset + num_new)
        merged = _merge(shared_out[:, :, rows_of], shared_max[:, :, rows_of], shared_sum[:, :, rows_of],
                        own_out.view(kv_heads, group, num_new, head_dim),
                        own_max.view(kv_heads, group, num_new), own_sum.view(kv_heads, group, num_new))
        out[t0:t1] = merged.permute(2, 0, 1, 3).to(out.dtype)
        offset += num_new


def _partial_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       causal_rows: int = 0, causal_bias: torch.Tensor | None = None,
                       fast: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
        bias[:, length - causal_rows:] = causal_bias[:causal_rows, :causal_rows]
    tile = r if causal_rows else _tile_rows(r, kv_heads * length * 4)
    for a in range(0, r, tile):
        b = min(r, a + tile)
        # scores: [kv_heads, b - a, L], in the model's dtype like the chunk-by-chunk softmax
        scores = torch.bmm(queries[:, a:b], keys.transpose(1, 2))
        if fast:
            cpu_kernels.softmax_unnormalized_(scores, causal_rows, row_max[:, a:b], row_sum[:, a:b])
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
    return (key_cache.index_select(0, slots).transpose(0, 1).contiguous(),
            value_cache.index_select(0, slots).transpose(0, 1).contiguous())


def _heads_major(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[tokens, heads, head_dim] -> [kv_heads, group, tokens, head_dim] (a view)."""
    tokens, heads, head_dim = query.shape
    return query.view(tokens, kv_heads, heads // kv_heads, head_dim).permute(1, 2, 0, 3)


def _attend_chunk(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  num_cached: int, causal_bias: torch.Tensor | None, out: torch.Tensor,
                  fast: bool = False) -> None:
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
        if fast:   # row i of each head's b - a rows sees [0, seen - (b - a) + i]
            cpu_kernels.softmax_(scores, b - a)
            probs = scores
        else:
            scores.view(kv_heads, group, b - a, seen)[..., num_cached:].add_(causal_bias[a:b, :b])
            probs = torch.softmax(scores, dim=-1)
        # tile_out: [kv_heads, group * (b - a), head_dim] -> out rows [a, b)
        tile_out = q_tile.new_empty(kv_heads, group * (b - a), head_dim)
        _matmul_heads(probs, values[:, :seen], tile_out)
        out[a:b] = tile_out.view(kv_heads, group, b - a, head_dim).permute(2, 0, 1, 3)


def _fast_softmax_applies(query: torch.Tensor) -> bool:
    return (query.device.type == "cpu" and query.dtype in (torch.float32, torch.bfloat16)
            and cpu_kernels.softmax_kernels() is not None)


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
