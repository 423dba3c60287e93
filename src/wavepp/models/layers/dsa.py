"""The DeepSeek sparse attention (DSA) indexer of GLM-5: which keys each query attends to.

Per layer with an indexer, every token also caches an indexer key (index_head_dim, its own
pool, same blocks). A query's score for key j of its context:

    score[i, j] = sum over indexer heads h of  w[i, h] * relu(q[i, h] . k[j] * D^-1/2)
    w = weights_proj(x) * H^-1/2;  q = wq_b(q_resid), k = LayerNorm(wk(x)), both RoPE'd
                                   (interleaved) on their first qk_rope_head_dim dims

and it keeps its index_topk best causal keys. ReLU makes exact ties (0.0) common; they are
broken toward the lower position (a stable sort), so the selection is deterministic. The
selection is returned as positions [num_tokens, index_topk], -1 where a query has fewer
causal keys than index_topk; a "shared" layer reuses it, and it crosses a stage boundary
with the activations when the next stage starts with such a layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wavepp.models.layers.context import ForwardContext
from wavepp.models.layers.rope import apply_rope
from wavepp.models.spec import MLASpec


class Indexer(nn.Module):
    def __init__(self, spec: MLASpec, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        index = spec.index  # MLASpec checks the q LoRA and the widths the indexer needs
        self.num_heads, self.head_dim = index.num_heads, index.head_dim
        self.rope, self.topk = spec.qk_rope_head_dim, index.topk
        self.wq_b = _param(dtype, self.num_heads * self.head_dim, spec.q_lora_rank)
        self.wk = _param(dtype, self.head_dim, hidden_size)
        self.k_norm_weight = _param(dtype, self.head_dim)
        self.k_norm_bias = _param(dtype, self.head_dim)
        # per-head weights of the scores: fp32 whatever the model dtype, as the reference keeps them
        self.weights_proj = _param(torch.float32, self.num_heads, hidden_size)

    def forward(
        self, x: torch.Tensor, q_resid: torch.Tensor, ctx: ForwardContext, key_cache: torch.Tensor
    ) -> torch.Tensor:
        """x: [n, hidden], q_resid: [n, q_lora_rank] -> top-k positions [n, index_topk] int64.
        Writes the batch's indexer keys into key_cache ([num_slots, index_head_dim])."""
        n, r = x.shape[0], self.rope
        batch, cos, sin, linear = ctx.batch, ctx.cos, ctx.sin, ctx.kernels.project
        # q: [n, heads, head_dim]; k: [n, head_dim]
        q = linear(q_resid, self.wq_b).view(n, self.num_heads, self.head_dim)
        q = torch.cat((apply_rope(q[..., :r], cos, sin, True, ctx.kernels), q[..., r:]), -1).float()
        k = F.layer_norm(
            linear(x, self.wk), (self.head_dim,), self.k_norm_weight, self.k_norm_bias, 1e-6
        )
        k = torch.cat((apply_rope(k[:, None, :r], cos, sin, True, ctx.kernels)[:, 0], k[:, r:]), -1)
        key_cache.index_copy_(0, batch.slot_mapping, k)
        # weights: [n, 1, heads]
        weights = (linear(x.float(), self.weights_proj) * self.num_heads**-0.5)[:, None, :]
        topk = torch.full((n, self.topk), -1, dtype=torch.int64, device=x.device)
        for index, chunk in enumerate(batch.chunks):
            t0, t1 = batch.token_starts[index], batch.token_starts[index + 1]
            context = batch.context_slots[
                batch.context_starts[index] : batch.context_starts[index + 1]
            ]
            keys = key_cache.index_select(0, context).float()
            # per_head: [m, heads, end] -> scores: [m, end]
            per_head = torch.relu(torch.matmul(q[t0:t1], keys.t()) * self.head_dim**-0.5)
            scores = torch.bmm(weights[t0:t1], per_head)[:, 0]
            # causal: [m, end], key j visible to new token i iff j <= num_cached + i
            causal = batch.visible_mask(index)
            scores.masked_fill_(~causal, float("-inf"))
            chosen = (
                causal if self.topk >= chunk.end else _top_lowest_first(scores, self.topk) & causal
            )
            keep = min(self.topk, chunk.end)
            # rank of each chosen key among its row's chosen keys, in position order
            rank = torch.where(chosen, chosen.cumsum(-1) - 1, keep)
            rows = torch.full((t1 - t0, keep + 1), -1, dtype=torch.int64, device=x.device)
            positions = torch.arange(chunk.end, device=x.device)
            rows.scatter_(1, rank, positions.expand(t1 - t0, -1))
            topk[t0:t1, :keep] = rows[:, :keep]
        return topk


def _top_lowest_first(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores: [m, end] -> [m, end] bool, True at each row's k best, ties at the k-th score
    going to the lowest positions. (A stable sort gives the same set; this costs a top-k.)"""
    kth = scores.topk(k, dim=-1).values[:, -1:]
    above, tied = scores > kth, scores == kth
    return above | (tied & (tied.cumsum(-1) <= k - above.sum(-1, keepdim=True)))


def selection_mask(topk: torch.Tensor, context_len: int) -> torch.Tensor:
    """topk: [m, k] positions (-1: none) -> [m, context_len] bool, True at the selected keys."""
    mask = torch.zeros(topk.shape[0], context_len + 1, dtype=torch.bool, device=topk.device)
    mask.scatter_(1, torch.where(topk < 0, context_len, topk), True)
    return mask[:, :context_len]


def _param(dtype: torch.dtype, *shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
