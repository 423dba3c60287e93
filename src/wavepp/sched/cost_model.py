"""Predicted time of a wave, fitted online from measured stage times.

A chunk of x new tokens after L cached ones costs

    t(L, x) = c0 + g*L + b*x + a*(2*L*x + x^2)

(c0: per-chunk overhead; g: reading the cached prefix; b: the linear layers; a: attention,
whose query x key pairs number about L*x + x^2/2 for causal attention, i.e. (2*L*x + x^2)/2.)
A wave costs c_wave (per-wave overhead: launch, transfer) plus the sum over its chunks.

Fitting is least squares with the prior as pseudo-observations: before any data the prior
rules; as measurements accumulate the fit converges to the true coefficients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Feature scales keep the normal equations well conditioned (tokens in thousands).
_SCALES = np.array([1.0, 1.0, 1e3, 1e3, 1e6])


@dataclass(frozen=True)
class CostCoefficients:
    c_wave: float = 2e-3    # seconds per wave
    c0: float = 2e-4        # seconds per chunk
    g: float = 1e-7         # seconds per cached token per chunk
    b: float = 4e-4         # seconds per new token
    a: float = 1e-9         # seconds per (2*L*x + x^2)

    def as_array(self) -> np.ndarray:
        return np.array([self.c_wave, self.c0, self.g, self.b, self.a])

    @classmethod
    def from_array(cls, v) -> "CostCoefficients":
        return cls(*(max(0.0, float(x)) for x in v))


def chunk_features(num_cached: int, num_new: int) -> tuple[float, float, float, float, float]:
    L, x = float(num_cached), float(num_new)
    return (0.0, 1.0, L, x, 2 * L * x + x * x)


class CostModel:
    def __init__(self, prior: CostCoefficients | None = None, *, prior_weight: float = 4.0,
                 decay: float = 1.0):
        """`prior_weight`: how many waves' worth of evidence the prior counts for at first.
        `decay` < 1 forgets old waves geometrically (tracks drifting machines)."""
        self.coef = prior or CostCoefficients()
        self._prior = self.coef.as_array() * _SCALES
        self._prior_weight = prior_weight
        self._decay = decay
        self._xtx = np.zeros((5, 5))
        self._xty = np.zeros(5)
        self._num_effective = 0.0
        self.num_observations = 0

    def chunk_time(self, num_cached: int, num_new: int) -> float:
        c = self.coef
        L, x = num_cached, num_new
        return c.c0 + c.g * L + c.b * x + c.a * (2 * L * x + x * x)

    def wave_time(self, chunks) -> float:
        """chunks: iterable of (num_cached, num_new)."""
        return self.coef.c_wave + sum(self.chunk_time(L, x) for L, x in chunks)

    def max_chunk_tokens(self, num_cached: int, budget_s: float) -> int:
        """Largest x (real, floored) with chunk_time(num_cached, x) <= budget_s; 0 if none."""
        c = self.coef
        rest = budget_s - c.c0 - c.g * num_cached
        if rest <= 0:
            return 0
        lin = c.b + 2 * c.a * num_cached
        if c.a <= 0:
            return int(rest / lin + 1e-6) if lin > 0 else 1 << 30
        # a*x^2 + lin*x - rest = 0, positive root, in the cancellation-free form (the 1e-6
        # absorbs rounding when the budget is exactly the cost of a whole number of tokens)
        return int(2 * rest / (lin + math.sqrt(lin * lin + 4 * c.a * rest)) + 1e-6)

    def observe(self, chunks, seconds: float) -> None:
        """One measured wave: chunks as (num_cached, num_new), seconds of its slowest stage."""
        f = np.array([1.0, 0.0, 0.0, 0.0, 0.0])
        for L, x in chunks:
            f += chunk_features(L, x)
        f = f / _SCALES
        self._xtx = self._decay * self._xtx + np.outer(f, f)
        self._xty = self._decay * self._xty + f * seconds
        self._num_effective = self._decay * self._num_effective + 1.0
        self.num_observations += 1
        self._refit()

    def _refit(self) -> None:
        # Ridge toward the prior, whose weight fades as evidence accumulates:
        # minimize |X w - y|^2 + (k / n^2) * sum_j d_j (w_j - w0_j)^2, d_j = mean of feature j
        # squared, n = number of waves. The prior counts as k waves at n = 1 and soon vanishes,
        # so exact measurements give back the exact coefficients.
        n = self._num_effective
        d = np.maximum(np.diag(self._xtx) / n, 1e-12)
        reg = np.diag(self._prior_weight * d / (n * n))
        a = self._xtx + reg
        rhs = self._xty + reg @ self._prior
        w = np.linalg.solve(a, rhs)
        if (w < 0).any():   # coefficients are costs: refit with the negative ones pinned at 0
            keep = np.flatnonzero(w > 0)
            w = np.zeros(5)
            if keep.size:
                w[keep] = np.maximum(np.linalg.solve(a[np.ix_(keep, keep)], rhs[keep]), 0.0)
        self.coef = CostCoefficients.from_array(w / _SCALES)

    def __repr__(self) -> str:
        return f"CostModel({self.coef}, n={self.num_observations})"

