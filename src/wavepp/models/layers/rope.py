"""RoPE: the cos/sin table of a `RopeSpec`, and the rotation in either pairing convention.

    rotate-half (Llama, Qwen, MiniMax-M2):  dimension i pairs with i + dim/2
    interleaved (DeepSeek, GLM-5):          dimension 2i pairs with 2i + 1

An interleaved rotation equals a rotate-half rotation of the de-interleaved vector
(x[0::2] | x[1::2]); the rotated part comes out in that order. Queries and keys are rotated
the same way, so their dot products are those of the interleaved convention.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from wavepp.models.kernels import Kernels
from wavepp.models.spec import Llama3RopeScaling, RopeSpec, YarnScaling


class RopeTable(nn.Module):
    """cos/sin of positions [0, spec.max_positions) for a `spec.dim`-wide rotation, in `dtype`."""

    def __init__(self, spec: RopeSpec, dtype: torch.dtype) -> None:
        super().__init__()
        self.dim, self.max_positions = spec.dim, spec.max_positions
        # inv_freq: [dim / 2], fp32
        inv_freq = 1.0 / spec.theta ** (
            torch.arange(0, spec.dim, 2, dtype=torch.int64).float() / spec.dim
        )
        scale = 1.0
        if isinstance(spec.scaling, Llama3RopeScaling):
            inv_freq = _llama3_inv_freq(inv_freq, spec.scaling)
        elif isinstance(spec.scaling, YarnScaling):
            inv_freq, scale = (
                _yarn_inv_freq(inv_freq, spec.dim, spec.theta, spec.scaling),
                spec.scaling.cos_sin_factor,
            )
        # freqs: [max_positions, dim / 2]
        freqs = torch.arange(spec.max_positions, dtype=torch.float32)[:, None] * inv_freq
        self.register_buffer("cos", (freqs.cos() * scale).to(dtype), persistent=False)
        self.register_buffer("sin", (freqs.sin() * scale).to(dtype), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [num_tokens] -> cos, sin: [num_tokens, 1, dim / 2]
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kernels: Kernels | None = None
) -> torch.Tensor:
    """Rotate x: [num_tokens, num_heads, dim] by cos/sin: [num_tokens, 1, dim / 2], rotate-half.
    `kernels`: the fused C++ pass where it runs (bf16 on the CPU; bit for bit the ops below)."""
    if (
        kernels is not None
        and x.dim() == 3
        and x.stride(-1) == 1
        and x.stride(1) == x.shape[-1]
        and cos.shape == sin.shape == (x.shape[0], 1, x.shape[-1] // 2)
        and x.dtype == torch.bfloat16
    ):
        fused = kernels.fused(cos, sin) if x.device.type == "cpu" else None
        if fused is not None:
            return fused.rotary(x, cos, sin)
    x1, x2 = x.chunk(2, dim=-1)
    # first half: x1*cos - x2*sin  |  second half: x2*cos + x1*sin
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleave: bool = False,
    kernels: Kernels | None = None,
) -> torch.Tensor:
    """Rotate x: [num_tokens, num_heads, rope_dim] (the rotated part only) by cos/sin:
    [num_tokens, 1, rope_dim / 2], in either convention."""
    if interleave:
        x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    return apply_rotary(x, cos, sin, kernels)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate in between.
    #   wavelen < high_wavelen: unchanged | high..low: smooth blend | wavelen > low_wavelen: / factor
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


def _yarn_inv_freq(
    inv_freq: torch.Tensor, dim: int, theta: float, yarn: YarnScaling
) -> torch.Tensor:
    # The dim index at which a frequency turns `rotations` times over the original context:
    #   [0, low)  fast, kept (extrapolated)  |  [low, high)  linear blend  |  [high, dim/2)  / factor
    def turning_dim(rotations: float) -> float:
        return (
            dim
            * math.log(yarn.original_max_position_embeddings / (rotations * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low, high = turning_dim(yarn.beta_fast), turning_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return inv_freq / yarn.factor * ramp + inv_freq * (1 - ramp)
