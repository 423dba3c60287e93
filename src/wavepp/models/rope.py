"""RoPE over part of a head: the first `dim` dimensions, in either pairing convention.

    rotate-half (Llama, MiniMax-M2):  dimension i pairs with i + dim/2
    interleaved (DeepSeek, GLM-5):    dimension 2i pairs with 2i + 1

An interleaved rotation equals a rotate-half rotation of the de-interleaved vector
(x[0::2] | x[1::2]); the rotated part comes out in that order. Queries and keys are rotated
the same way, so their dot products are those of the interleaved convention.
"""

from __future__ import annotations

import torch
from torch import nn

from wavepp.models.layers import apply_rotary


class RopeTable(nn.Module):
    """cos/sin of positions [0, max_positions) for a `dim`-wide rotation, in `dtype`."""

    def __init__(self, dim: int, theta: float, max_positions: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.dim, self.max_positions = dim, max_positions
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
        # freqs: [max_positions, dim / 2]
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq
        self.register_buffer("cos", freqs.cos().to(dtype), persistent=False)
        self.register_buffer("sin", freqs.sin().to(dtype), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [num_tokens] -> cos, sin: [num_tokens, 1, dim / 2]
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = False) -> torch.Tensor:
    """Rotate x: [num_tokens, num_heads, rope_dim] (the rotated part only) by cos/sin:
    [num_tokens, 1, rope_dim / 2]."""
    if interleave:
        x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    return apply_rotary(x, cos, sin)
