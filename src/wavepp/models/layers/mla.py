"""Multi-head latent attention (DeepSeek-V3, GLM-5) over a paged latent cache.

The cache holds, per token and layer, one row: the normalized compressed latent c
(kv_lora_rank) and the rotated RoPE key shared by all heads (qk_rope_head_dim). Attention
runs in "MHA form": each chunk expands the latents of its whole context [0, end) into
per-head keys and values with kv_b_proj, then attends.

    x ─ q_a_proj ─ q_a_norm ─ q_resid ─ q_b_proj ─ q: [n, heads, nope | rope]   (or q_proj)
    x ─ kv_a_proj ─ c: kv_a_norm ─┐
                    k_rope: RoPE ─┴─ latent pool row [c | k_rope]
    context rows ─ kv_b_proj(c) ─ k_nope, v per head; key = [k_nope | k_rope]

With a DSA indexer (GLM-5) each query attends only to the keys its layer's top-k selects
(`Indexer`); a "shared" layer takes the selection of the layer before it.

In latent ("absorbed") form nothing is expanded: each head's q_nope is taken into the latent
space by kv_b_proj's key half, the heads share one KV head of kv_lora_rank + rope dims read
from the cache in place, and the value half brings each head's output back. Two kernels run it:
the `amx` attention kernel (bf16 on a CPU with AMX; layers without a top-k selection), and SDPA
where the stage's `Kernels.mla` is "absorbed" (the CUDA path; with a DSA selection as its mask).
"""

from __future__ import annotations

import torch
from torch import nn

from wavepp.models.kernels.attention_amx import amx_applies, amx_attention
from wavepp.models.kernels.attention_torch import shared_kv_sdpa
from wavepp.models.layers.context import ForwardContext
from wavepp.models.layers.dsa import Indexer, selection_mask
from wavepp.models.layers.norm import RMSNorm
from wavepp.models.layers.rope import apply_rope
from wavepp.models.spec import MLASpec


class MLAttention(nn.Module):
    def __init__(self, spec: MLASpec, layer: int, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = spec.num_heads
        self.nope, self.rope, self.v_dim = (
            spec.qk_nope_head_dim,
            spec.qk_rope_head_dim,
            spec.v_head_dim,
        )
        self.kv_lora_rank = spec.kv_lora_rank
        self.interleave = spec.rope_interleave
        self.rotates = spec.rotates  # Kimi-Linear: the "rope" dims stay unrotated
        self.reuses_topk = spec.reuses_topk
        self.scale = spec.softmax_scale
        hidden, heads = hidden_size, spec.num_heads
        self.q_lora = bool(spec.q_lora_rank)
        if self.q_lora:
            self.q_a_proj = _param(dtype, spec.q_lora_rank, hidden)
            # q_a / kv_a norms use their module's default eps (1e-6), as the reference does
            self.q_a_norm = RMSNorm(spec.q_lora_rank, 1e-6, dtype)
            self.q_b_proj = _param(dtype, heads * spec.qk_head_dim, spec.q_lora_rank)
        else:
            self.q_proj = _param(dtype, heads * spec.qk_head_dim, hidden)
        self.kv_a_proj = _param(dtype, spec.kv_lora_rank + spec.qk_rope_head_dim, hidden)
        self.kv_a_norm = RMSNorm(spec.kv_lora_rank, 1e-6, dtype)
        self.kv_b_proj = _param(
            dtype, heads * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank
        )
        self.o_proj = _param(dtype, hidden, heads * spec.v_head_dim)
        self.indexer = Indexer(spec, hidden, dtype) if spec.runs_indexer else None

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x: [n, hidden] -> [n, hidden]. Writes the batch's latent rows (and indexer keys) into
        the cache. Sets ctx.topk to this layer's selection ([n, index_topk]; None without DSA);
        a layer that shares the previous layer's selection reads it from there."""
        n, heads, batch, linear = x.shape[0], self.num_heads, ctx.batch, ctx.kernels.project
        q, q_resid, latent_rows = self._project(x, ctx)
        latent_cache = ctx.cache.view("latent", self.layer)
        latent_cache.index_copy_(0, batch.slot_mapping, latent_rows)
        topk = self._select(x, q_resid, ctx)
        if topk is None and ctx.kernels.attention == "amx" and amx_applies(q):
            out = self._latent_attention(q, latent_cache, batch)
        elif ctx.kernels.mla == "absorbed":
            out = self._absorbed_attention(q, latent_cache, batch, topk)
        else:
            out = self._expanded_attention(q, latent_cache, batch, topk, linear)
        # out: [n, heads, v] -> [n, hidden]
        return linear(out.reshape(n, heads * self.v_dim), self.o_proj)

    def _project(
        self, x: torch.Tensor, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """x: [n, hidden] -> (q [n, heads, nope + rope], the query's low-rank residual (None
        without q_lora), the latent rows [n, kv_lora + rope] to cache), rotated if it rotates."""
        n, heads, kernels, linear = x.shape[0], self.num_heads, ctx.kernels, ctx.kernels.project
        cos, sin = ctx.cos, ctx.sin
        q_resid = None
        if self.q_lora:
            q_resid = self.q_a_norm(linear(x, self.q_a_proj), kernels)
            q = linear(q_resid, self.q_b_proj)
        else:
            q = linear(x, self.q_proj)
        # q: [n, heads, nope + rope]
        q = q.view(n, heads, self.nope + self.rope)
        c, k_rope = linear(x, self.kv_a_proj).split([self.kv_lora_rank, self.rope], dim=-1)
        if self.rotates:
            q = torch.cat(
                (
                    q[..., : self.nope],
                    apply_rope(q[..., self.nope :], cos, sin, self.interleave, kernels),
                ),
                -1,
            )
            k_rope = apply_rope(k_rope[:, None], cos, sin, self.interleave, kernels)[:, 0]
        return q, q_resid, torch.cat((self.kv_a_norm(c, kernels), k_rope), -1)

    def _select(
        self, x: torch.Tensor, q_resid: torch.Tensor | None, ctx: ForwardContext
    ) -> torch.Tensor | None:
        """This layer's top-k selection, set on ctx: its indexer's (which writes the batch's
        index keys), the previous layer's if it shares it, or None without DSA."""
        if self.indexer is not None:
            ctx.topk = self.indexer(x, q_resid, ctx, ctx.cache.view("index_key", self.layer))
        elif not self.reuses_topk:
            ctx.topk = None
        elif ctx.topk is None:
            raise ValueError(
                f"layer {self.layer} shares the previous layer's top-k, but none was given"
            )
        return ctx.topk

    def _expanded_attention(
        self, q: torch.Tensor, latent_cache: torch.Tensor, batch, topk: torch.Tensor | None, linear
    ) -> torch.Tensor:
        """Attention in MHA form, chunk by chunk over each context's expanded latent rows.
        q: [n, heads, nope + rope] -> [n, heads, v]."""
        out = q.new_empty(q.shape[0], self.num_heads, self.v_dim)
        for index in range(batch.num_chunks):
            t0, t1 = batch.token_starts[index], batch.token_starts[index + 1]
            context = batch.context_slots[
                batch.context_starts[index] : batch.context_starts[index + 1]
            ]
            rows = latent_cache.index_select(0, context)
            visible = _visible(batch, index, topk)
            out[t0:t1] = self._chunk_attention(q[t0:t1], rows, visible, linear).to(out.dtype)
        return out

    def _chunk_attention(
        self, q: torch.Tensor, rows: torch.Tensor, visible: torch.Tensor, linear
    ) -> torch.Tensor:
        """One chunk's attention in MHA form over its context's latent rows, in fp32.
        q: [chunk_tokens, heads, nope + rope], rows: [end, kv_lora + rope], visible:
        [chunk_tokens, end] -> [chunk_tokens, heads, v] (fp32)."""
        heads = self.num_heads
        # rows: [end, kv_lora + rope] -> per-head keys [heads, end, nope + rope],
        # values [heads, end, v]
        kv = linear(rows[:, : self.kv_lora_rank], self.kv_b_proj).view(
            -1, heads, self.nope + self.v_dim
        )
        keys = torch.cat(
            (kv[..., : self.nope], rows[:, None, self.kv_lora_rank :].expand(-1, heads, -1)), -1
        )
        # scores: [heads, chunk_tokens, end], -inf where not visible. In fp32, as the
        # reference computes them: bf16 scores of 24-dim heads drift by ~0.1 in logprob
        bias = torch.zeros(visible.shape, device=rows.device).masked_fill_(~visible, float("-inf"))
        scores = torch.baddbmm(
            bias, q.transpose(0, 1).float(), keys.permute(1, 2, 0).float(), alpha=self.scale
        )
        o = torch.bmm(torch.softmax(scores, dim=-1), kv[..., self.nope :].transpose(0, 1).float())
        return o.transpose(0, 1)

    def _absorbed_attention(
        self, q: torch.Tensor, latent_cache: torch.Tensor, batch, topk: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention in latent form by SDPA, chunk by chunk (`shared_kv_sdpa`): the context's
        latent rows [c | k_rope] are the one KV head of every query head, read as they are
        cached, the latents c its values; a DSA selection joins the causal mask. Nothing is
        expanded, so a long cached prefix costs no kv_b_proj over it (the CUDA path).
        q: [n, heads, nope + rope] -> [n, heads, v]."""
        rank = self.kv_lora_rank
        query = self._absorb(q)  # [n, heads, rank + rope]
        o_lat = query.new_empty(q.shape[0], self.num_heads, rank)
        for index in range(batch.num_chunks):
            t0, t1 = batch.token_starts[index], batch.token_starts[index + 1]
            context = batch.context_slots[
                batch.context_starts[index] : batch.context_starts[index + 1]
            ]
            rows = latent_cache.index_select(0, context)  # [end, rank + rope]
            o_lat[t0:t1] = shared_kv_sdpa(
                query[t0:t1], rows, rows[:, :rank], _visible(batch, index, topk), self.scale
            )
        return self._unabsorb(o_lat)

    def _latent_attention(self, q: torch.Tensor, latent_cache: torch.Tensor, batch) -> torch.Tensor:
        """Attention in latent form on the AMX kernel: one KV head [c | k_rope] for all heads
        read straight from the latent cache, the latents c as values. The MHA form's result
        up to rounding, without expanding any context.
        q: [n, heads, nope + rope] -> [n, heads, v]."""
        n, heads, rank = q.shape[0], self.num_heads, self.kv_lora_rank
        o_lat = amx_attention(
            self._absorb(q), latent_cache[:, None], latent_cache[:, None, :rank], batch, self.scale
        )
        return self._unabsorb(o_lat.view(n, heads, rank))

    def _absorb(self, q: torch.Tensor) -> torch.Tensor:
        """Each head's q_nope taken into the latent space by the key half of kv_b_proj
        (q_lat = q_nope W_UK), its RoPE part kept:
        [n, heads, nope + rope] -> [n, heads, rank + rope]."""
        w = self.kv_b_proj.view(self.num_heads, self.nope + self.v_dim, self.kv_lora_rank)
        q_lat = torch.bmm(
            q[..., : self.nope].transpose(0, 1), w[:, : self.nope]
        )  # [heads, n, rank]
        return torch.cat((q_lat.transpose(0, 1), q[..., self.nope :]), -1)

    def _unabsorb(self, o_lat: torch.Tensor) -> torch.Tensor:
        """Each head's latent output brought back by the value half (o = o_lat W_UV^T):
        [n, heads, rank] -> [n, heads, v]."""
        w = self.kv_b_proj.view(self.num_heads, self.nope + self.v_dim, self.kv_lora_rank)
        out = torch.bmm(o_lat.transpose(0, 1), w[:, self.nope :].transpose(1, 2))
        return out.transpose(0, 1)


def _visible(batch, index: int, topk: torch.Tensor | None) -> torch.Tensor:
    """Which keys of its context [0, end) each new token of chunk `index` attends to:
    [chunk_tokens, end] bool, on the batch's device; causal, and selected where DSA chose."""
    visible = batch.visible_mask(index)
    if topk is None:
        return visible
    t0, t1 = batch.token_starts[index], batch.token_starts[index + 1]
    return visible & selection_mask(topk[t0:t1], batch.chunks[index].end)


def _param(dtype: torch.dtype, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
