"""Mixture of experts: a top-k router and experts run grouped by expert.

Routing (`spec/mlp.py` MoESpec.scoring), scores in fp32:

    sigmoid  (MiniMax-M2, DeepSeek-V3, GLM-5, Kimi-Linear; MiniMax-M2 has one group)
      scores  = sigmoid(x @ gate^T)                     [num_tokens, num_experts]
      choice  = scores + e_score_correction_bias        (the bias picks, it never weighs)
      groups  : keep the topk_group groups whose two best choices sum highest
      experts = top-k of choice within the kept groups
      weights = scores[experts], normalized to sum 1 (norm_topk_prob) * routed_scaling_factor
    softmax  (Qwen3-MoE)
      scores  = softmax(x @ gate^T); experts = their top-k; weights = scores[experts],
      normalized to sum 1 where norm_topk_prob

Execution: the (token, expert) pairs are sorted by expert, so each active expert runs one
gate/up matmul and one down matmul over all of its tokens (the stage's experts kernel,
`kernels/experts.py`: a loop over active experts, or one grouped GEMM), never a loop over
tokens; results scatter back with their weights. Shared experts run densely.
"""

from __future__ import annotations

import torch
from torch import nn

from wavepp.models.kernels import Kernels
from wavepp.models.layers.mlp import SwiGLUMLP
from wavepp.models.spec import MoESpec


class Router(nn.Module):
    def __init__(self, spec: MoESpec, hidden_size: int) -> None:
        super().__init__()
        num_experts = spec.num_experts
        self.num_experts, self.top_k, self.scoring = num_experts, spec.top_k, spec.scoring
        self.n_group, self.topk_group = spec.n_group, spec.topk_group
        self.norm_topk_prob, self.scaling_factor = spec.norm_topk_prob, spec.routed_scaling_factor
        # the router decides discrete choices: it stays fp32 whatever the model dtype
        self.weight = nn.Parameter(
            torch.empty(num_experts, hidden_size, dtype=torch.float32), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.empty(num_experts, dtype=torch.float32), requires_grad=False)
            if spec.score_bias
            else None
        )

    def forward(self, x: torch.Tensor, kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [num_tokens, hidden] -> (weights [num_tokens, top_k] fp32, experts [num_tokens, top_k] int64)."""
        logits = kernels.project(x.float(), self.weight)
        if self.scoring == "softmax":
            weights, experts = logits.softmax(-1).topk(self.top_k, dim=-1)
            if self.norm_topk_prob:
                weights = weights / weights.sum(-1, keepdim=True)
            return weights * self.scaling_factor, experts
        scores = logits.sigmoid()
        choice = scores if self.bias is None else scores + self.bias
        if self.n_group > 1:
            # group_scores: [num_tokens, n_group], the sum of each group's two best choices
            grouped = choice.view(-1, self.n_group, self.num_experts // self.n_group)
            group_scores = grouped.topk(2, dim=-1).values.sum(-1)
            kept = group_scores.topk(self.topk_group, dim=-1).indices
            dropped = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, kept, False)
            choice = grouped.masked_fill(dropped[..., None], float("-inf")).view_as(choice)
        experts = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scaling_factor, experts


class Experts(nn.Module):
    """`num_experts` SwiGLU experts stacked: gate_up [E, 2 * I, H], down [E, H, I]."""

    def __init__(
        self, num_experts: int, hidden_size: int, intermediate_size: int, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype),
            requires_grad=False,
        )
        self.down_proj = nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size, dtype=dtype),
            requires_grad=False,
        )

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, kernels: Kernels
    ) -> torch.Tensor:
        """x: [num_tokens, H]; weights, experts: [num_tokens, top_k] -> [num_tokens, H]."""
        num_tokens, top_k = experts.shape
        flat = experts.flatten()
        # pairs sorted by expert: pair p is (token order[p] // top_k, expert flat[order[p]])
        order = torch.argsort(flat, stable=True)
        tokens = order // top_k
        # routed: [num_tokens * top_k, H], rows grouped by expert, through the stage's kernel
        routed = x.index_select(0, tokens)
        out = kernels.experts(routed, flat[order], self.gate_up_proj, self.down_proj)
        out.mul_(weights.flatten()[order, None].to(out.dtype))
        return torch.zeros_like(x).index_add_(0, tokens, out)


class MoE(nn.Module):
    """Routed experts plus optional shared experts (one SwiGLU of num_shared * I)."""

    def __init__(self, spec: MoESpec, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.router = Router(spec, hidden_size)
        self.experts = Experts(spec.num_experts, hidden_size, spec.intermediate_size, dtype)
        self.shared = (
            SwiGLUMLP(hidden_size, spec.intermediate_size * spec.num_shared_experts, dtype)
            if spec.num_shared_experts
            else None
        )

    def forward(self, x: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        # x: [num_tokens, hidden] -> [num_tokens, hidden]
        weights, experts = self.router(x, kernels)
        out = self.experts(x, weights, experts, kernels)
        return out if self.shared is None else out.add_(self.shared(x, kernels))
