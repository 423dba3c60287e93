"""RoPE over part of a head: the first `dim` dimensions, in either pairing convention.

    rotate-half (Llama, MiniMax-M2):  dimension i pairs with i + dim/2
    interleaved (DeepSeek, GLM-5):    dimension 2i pairs with 2i + 1

An interleaved rotation equals a rotate-half rotation of the de-interleaved vector
(x[0::2] | x[1::2]); the rotated part comes out in that order. Queries and keys are rotated
the same way, so their dot products are those of the interleaved convention.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from wavepp.models.layers import apply_rotary


class RopeTable(nn.Module):
    """cos/sin of positions [0, max_positions) for a `dim`-wide rotation, in `dtype`."""

    def __init__(self, dim: int, theta: float, max_positions: int, dtype: torch.dtype, yarn=None) -> None:
        super().__init__()
        self.dim, self.max_positions = dim, max_positions
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
        scale = 1.0
        if yarn is not None:
            inv_freq, scale = _yarn_inv_freq(inv_freq, dim, theta, yarn), yarn.cos_sin_factor
        # freqs: [max_positions, dim / 2]
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq
        self.register_buffer("cos", (freqs.cos() * scale).to(dtype), persistent=False)
        self.register_buffer("sin", (freqs.sin() * scale).to(dtype), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [num_tokens] -> cos, sin: [num_tokens, 1, dim / 2]
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def _yarn_inv_freq(inv_freq: torch.Tensor, dim: int, theta: float, yarn) -> torch.Tensor:
    # The dim index at which a frequency turns `rotations` times over the original context:
    #   [0, low)  fast, kept (extrapolated)  |  [low, high)  linear blend  |  [high, dim/2)  / factor
    def turning_dim(rotations: float) -> float:
        return dim * math.log(yarn.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = turning_dim(yarn.beta_fast), turning_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return inv_freq / yarn.factor * ramp + inv_freq * (1 - ramp)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = False) -> torch.Tensor:
    """Rotate x: [num_tokens, num_heads, rope_dim] (the rotated part only) by cos/sin:
    [num_tokens, 1, rope_dim / 2]."""
    if interleave:
        x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    return apply_rotary(x, cos, sin)
