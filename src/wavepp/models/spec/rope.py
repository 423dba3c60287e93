"""Rotary position embedding: which dims rotate, at what frequencies, in which pairing.

    rotate-half (Llama, Qwen, MiniMax-M2):  dimension i pairs with i + dim/2
    interleaved (DeepSeek, GLM-5):          dimension 2i pairs with 2i + 1

and two frequency scalings besides the plain theta^(-2i/dim): Llama 3.1's (`Llama3RopeScaling`)
and YaRN (`YarnScaling`, as the released DeepSeek-V3 and Kimi-K2 use it). Pure Python: the
tables themselves are built by `layers/rope.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1 frequency-dependent RoPE scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.low_freq_factor <= 0:
            raise ValueError(f"llama3 rope scaling needs positive factors, got {self}")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"llama3 rope scaling needs high_freq_factor > low_freq_factor, got {self}"
            )


@dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling (rope_type "yarn"): low frequencies divided by `factor`, high ones
    kept, a linear ramp between the dims that turn beta_fast and beta_slow times over
    original_max_position_embeddings; cos/sin scaled by attention_factor, and MLA's softmax
    scale by mscale(factor, mscale_all_dim)^2."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.original_max_position_embeddings <= 0:
            raise ValueError(
                f"yarn rope scaling needs factor > 0 and original_max_position_embeddings > 0, "
                f"got {self}"
            )

    @staticmethod
    def _mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    @property
    def cos_sin_factor(self) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return self._mscale(self.factor, self.mscale) / self._mscale(
                self.factor, self.mscale_all_dim
            )
        return self._mscale(self.factor)

    @property
    def softmax_factor(self) -> float:
        """What MLA multiplies its softmax scale by."""
        return self._mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0


RopeScaling = Llama3RopeScaling | YarnScaling


@dataclass(frozen=True)
class RopeSpec:
    """cos/sin of positions [0, max_positions) for a `dim`-wide rotation (the first `dim` dims
    of each rotated head)."""

    dim: int
    theta: float
    max_positions: int
    interleave: bool = False
    scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        if self.dim <= 0 or self.dim % 2:
            raise ValueError(f"RopeSpec.dim={self.dim} must be even and positive")
        if not self.theta > 0 or self.max_positions <= 0:
            raise ValueError(
                f"RopeSpec needs theta > 0 and max_positions > 0, got {self.theta}, {self.max_positions}"
            )


def rope_parameters(
    hf: dict, model_type: str, supported: tuple[str, ...]
) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) of an HF config.json dict. transformers 5 writes rope_parameters
    {rope_type, rope_theta, ...}; older configs carry rope_theta at the top level and an
    optional rope_scaling dict. Raises ValueError naming a rope_type outside `supported`."""
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in supported:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported for {model_type}; supported: "
            + ", ".join(repr(s) for s in supported)
        )
    if rope_type == "llama3":
        return theta, Llama3RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    if rope_type == "yarn":
        original = int(params["original_max_position_embeddings"])
        factor = params.get("factor") or hf["max_position_embeddings"] / original
        return theta, YarnScaling(
            factor=float(factor),
            original_max_position_embeddings=original,
            beta_fast=float(params.get("beta_fast") or 32),
            beta_slow=float(params.get("beta_slow") or 1),
            mscale=float(params.get("mscale") or 0),
            mscale_all_dim=float(params.get("mscale_all_dim") or 0),
            attention_factor=params.get("attention_factor"),
            truncate=bool(params.get("truncate", True)),
        )
    return theta, None
