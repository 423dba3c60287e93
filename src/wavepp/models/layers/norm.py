"""Building blocks of a Llama-family decoder layer: RMSNorm, rotary embedding, SwiGLU MLP.

All take flat token batches ([num_tokens, ...]: tokens of every chunk side by side), so the
matmuls run once over the whole batch. Parameters are created empty: the loader fills them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from wavepp.models import cpu_kernels
from wavepp.models.config import Llama3RopeScaling, ModelConfig
from wavepp.models.kernels import linear


def _fused(*tensors: torch.Tensor):
    """The C++ elementwise module where it runs these tensors (bf16, on the CPU, contiguous),
    else None: torch's ops. Both round alike (`cpu_elementwise.cpp`)."""
    if not all(t.dtype == torch.bfloat16 and t.device.type == "cpu" and t.is_contiguous() for t in tensors):
        return None
    return cpu_kernels.elementwise_kernels()


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dim; the statistics in fp32 whatever the input dtype."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., dim] -> [..., dim], same dtype
        fused = _fused(x, self.weight)
        if fused is not None:
            return fused.rms_norm(x.view(-1, x.shape[-1]), self.weight, self.eps).view(x.shape)
        # squares in place only on a copy: for fp32 input, x.float() is x itself (the residual
        # stream); x * scale promotes to fp32, so no fp32 copy of x is kept
        squares = x.float().square() if x.dtype == torch.float32 else x.float().square_()
        scale = torch.rsqrt(squares.mean(-1, keepdim=True).add_(self.eps))
        return (x * scale).to(x.dtype).mul_(self.weight)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin for positions [0, max_positions), in the model dtype.

    Pairs dimension i with i + head_dim/2 (the HF "rotate half" convention).
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.max_positions = config.max_position_embeddings
        inv_freq = _inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        # freqs: [max_positions, head_dim / 2]
        freqs = torch.arange(self.max_positions, dtype=torch.float32)[:, None] * inv_freq
        self.register_buffer("cos", freqs.cos().to(dtype), persistent=False)
        self.register_buffer("sin", freqs.sin().to(dtype), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [num_tokens] -> cos, sin: [num_tokens, 1, head_dim / 2]
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x: [num_tokens, num_heads, head_dim] by cos/sin: [num_tokens, 1, head_dim / 2]."""
    if x.dim() == 3 and x.stride(-1) == 1 and x.stride(1) == x.shape[-1] and \
            cos.shape == sin.shape == (x.shape[0], 1, x.shape[-1] // 2):
        fused = _fused(cos, sin) if x.dtype == torch.bfloat16 and x.device.type == "cpu" else None
        if fused is not None:   # one pass, rounded as the ops below (bit for bit)
            return fused.rotary(x, cos, sin)
    x1, x2 = x.chunk(2, dim=-1)
    # first half: x1*cos - x2*sin  |  second half: x2*cos + x1*sin
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one [2 * intermediate, hidden]
    matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(2 * intermediate_size, hidden_size, dtype=dtype),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(hidden_size, intermediate_size, dtype=dtype),
                                      requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, hidden] -> gate_up: [num_tokens, 2 * intermediate]
        gate_up = linear(x, self.gate_up_proj)
        fused = _fused(gate_up) if gate_up.dim() == 2 else None
        if fused is not None:
            # act: [num_tokens, intermediate] in one pass over gate_up (rounded as below)
            return linear(fused.silu_mul(gate_up), self.down_proj)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        # act: [num_tokens, intermediate] -> [num_tokens, hidden]
        return linear(F.silu(gate).mul_(up), self.down_proj)


def _inv_freq(head_dim: int, theta: float, scaling: Llama3RopeScaling | None) -> torch.Tensor:
    # inv_freq: [head_dim / 2], fp32
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    if scaling is None:
        return inv_freq
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate in between.
    #   wavelen < high_wavelen: unchanged | high..low: smooth blend | wavelen > low_wavelen: / factor
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)
