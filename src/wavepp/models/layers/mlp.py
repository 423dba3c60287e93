"""The dense SwiGLU MLP: down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wavepp.models.kernels import Kernels


class SwiGLUMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(
            torch.empty(2 * intermediate_size, hidden_size, dtype=dtype), requires_grad=False
        )
        self.down_proj = nn.Parameter(
            torch.empty(hidden_size, intermediate_size, dtype=dtype), requires_grad=False
        )

    def forward(self, x: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        # x: [num_tokens, hidden] -> gate_up: [num_tokens, 2 * intermediate]
        gate_up = kernels.project(x, self.gate_up_proj)
        fused = kernels.fused(gate_up) if gate_up.dim() == 2 else None
        if fused is not None:
            # act: [num_tokens, intermediate] in one pass over gate_up (rounded as below)
            return kernels.project(fused.silu_mul(gate_up), self.down_proj)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        # act: [num_tokens, intermediate] -> [num_tokens, hidden]
        return kernels.project(F.silu(gate).mul_(up), self.down_proj)
