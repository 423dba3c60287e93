"""RMSNorm: x / rms(x) * weight over the last dim, the statistics in fp32 whatever the dtype."""

from __future__ import annotations

import torch
from torch import nn

from wavepp.models.kernels import Kernels


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, kernels: Kernels | None = None) -> torch.Tensor:
        """x: [..., dim] -> [..., dim], same dtype. `kernels`: the fused C++ pass where it runs
        (bf16 on the CPU; rounded as below), else (or None) torch's ops."""
        fused = kernels.fused(x, self.weight) if kernels is not None else None
        if fused is not None:
            return fused.rms_norm(x.view(-1, x.shape[-1]), self.weight, self.eps).view(x.shape)
        # squares in place only on a copy: for fp32 input, x.float() is x itself (the residual
        # stream); x * scale promotes to fp32, so no fp32 copy of x is kept
        squares = x.float().square() if x.dtype == torch.float32 else x.float().square_()
        scale = torch.rsqrt(squares.mean(-1, keepdim=True).add_(self.eps))
        return (x * scale).to(x.dtype).mul_(self.weight)
