"""Predicted time of a wave, fitted online from measured stage times.

A chunk of x new tokens after L cached ones costs

    t(L, x) = c0 + g*L + b*x + a*(2*L*x + x^2)

(c0: per-chunk overhead; g: reading the cached prefix; b: the linear layers; a: attention,
whose query x key pairs number about L*x + x^2/2 for causal attention, i.e. (2*L*x + x^2)/2.)
A wave of T = sum(x) tokens costs c_wave (per-wave overhead: launch, transfer) plus the sum
over its chunks, plus b*max(0, knee - T): below `knee_tokens` a wave's linear layers cost what
a knee-sized wave's do. That is the efficiency of a wave's size: on a GPU a small wave reads
every weight (every touched expert) from HBM for few rows, and a GEMM of few rows per expert
fills its tiles poorly; on a CPU the knee is about 0.

Fitting is least squares with the prior as pseudo-observations: before any data the prior
rules; as measurements accumulate the fit converges to the true coefficients. The knee is not
fitted online (the model is not linear in it): `fit_coefficients` picks it from a profiling
pass over waves of varied shape (`profile_wave_shapes`), since uniform chunks cannot separate
per-wave, per-chunk and per-token costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Feature scales keep the normal equations well conditioned (tokens in thousands).
_SCALES = np.array([1.0, 1.0, 1e3, 1e3, 1e6])


@dataclass(frozen=True)
class CostCoefficients:
    c_wave: float = 2e-3  # seconds per wave
    c0: float = 2e-4  # seconds per chunk
    g: float = 1e-7  # seconds per cached token per chunk
    b: float = 4e-4  # seconds per new token
    a: float = 1e-9  # seconds per (2*L*x + x^2)
    knee_tokens: float = 0.0  # a wave of fewer tokens costs b*knee for its linear layers

    def __post_init__(self) -> None:
        if self.knee_tokens < 0:
            raise ValueError(f"CostCoefficients.knee_tokens must be >= 0, got {self.knee_tokens}")

    def as_array(self) -> np.ndarray:
        return np.array([self.c_wave, self.c0, self.g, self.b, self.a])

    @classmethod
    def from_array(cls, v, knee_tokens: float = 0.0) -> "CostCoefficients":
        c_wave, c0, g, b, a = (max(0.0, float(x)) for x in v)  # as_array's order
        return cls(c_wave, c0, g, b, a, knee_tokens=knee_tokens)


def chunk_features(num_cached: int, num_new: int) -> tuple[float, float, float, float, float]:
    L, x = float(num_cached), float(num_new)
    return (0.0, 1.0, L, x, 2 * L * x + x * x)


class CostModel:
    def __init__(
        self,
        prior: CostCoefficients | None = None,
        *,
        prior_weight: float = 4.0,
        decay: float = 1.0,
    ):
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
        total, num_tokens = self.coef.c_wave, 0
        for L, x in chunks:
            total += self.chunk_time(L, x)
            num_tokens += x
        return total + self.underfill_time(num_tokens)

    def underfill_time(self, num_tokens: int) -> float:
        """What a wave of `num_tokens` pays for being below the knee: b*max(0, knee - T)."""
        c = self.coef
        return c.b * max(0.0, c.knee_tokens - num_tokens)

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
        f = wave_features(chunks, self.coef.knee_tokens) / _SCALES
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
        if (w < 0).any():  # coefficients are costs: refit with the negative ones pinned at 0
            keep = np.flatnonzero(w > 0)
            w = np.zeros(5)
            if keep.size:
                w[keep] = np.maximum(np.linalg.solve(a[np.ix_(keep, keep)], rhs[keep]), 0.0)
        self.coef = CostCoefficients.from_array(w / _SCALES, self.coef.knee_tokens)

    def __repr__(self) -> str:
        return f"CostModel({self.coef}, n={self.num_observations})"


def wave_features(chunks, knee_tokens: float = 0.0) -> np.ndarray:
    """[1, chunks, sum L, max(T, knee), sum(2*L*x + x^2)]: wave_time is their dot product with
    (c_wave, c0, g, b, a)."""
    f = np.array([1.0, 0.0, 0.0, 0.0, 0.0])
    num_tokens = 0
    for L, x in chunks:
        f += chunk_features(L, x)
        num_tokens += x
    f[3] = max(float(num_tokens), knee_tokens)
    return f


def profile_wave_shapes(max_wave_tokens: int, block_size: int = 16) -> list[list[tuple[int, int]]]:
    """Waves of varied shape for a profiling pass at start-up: one and four chunks, sizes from
    a block to `max_wave_tokens` (halving), after no prefix and after prefixes of 1x and 4x the
    largest wave. Per-wave, per-chunk and per-token costs separate only on such a mix."""
    sizes, x = [], max_wave_tokens
    while x >= block_size:
        sizes.append(x)
        x //= 2
    shapes = []
    for L in (0, max_wave_tokens, 4 * max_wave_tokens):
        for x in sizes:
            for n in (1, 4):
                per_chunk = max(block_size, x // n // block_size * block_size)
                shapes.append([(L, per_chunk)] * n)
    return shapes


def efficient_wave_tokens(
    coef: CostCoefficients, max_tokens: int, block_size: int = 16, efficiency: float = 0.75
) -> int:
    """The smallest wave, halving from `max_tokens` (block aligned), that spends at least
    `efficiency` of its time on its tokens' linear work rather than on per-wave costs:
    b*T >= efficiency * (c_wave + c0 + b*max(T, knee)). Larger waves buy little, and in a
    closed loop they finish requests in lumps. A deployment sets its largest wave (the
    planners' M) from this and `peak_wave_tokens` after its profiling pass."""
    if not 0 < efficiency < 1:
        raise ValueError(f"efficiency must be in (0, 1), got {efficiency}")
    sizes, t = [], max(block_size, max_tokens // block_size * block_size)
    while t >= block_size:
        sizes.append(t)
        t = t // 2 // block_size * block_size
    c = coef
    fits = [
        t for t in sizes if c.b * t >= efficiency * (c.c_wave + c.c0 + c.b * max(t, c.knee_tokens))
    ]
    return min(fits) if fits else sizes[0]


def peak_wave_tokens(samples) -> int:
    """The size of the profiling pass's one-chunk wave from an empty cache with the most tokens
    per second, as measured (samples of (chunks, seconds); the smaller of two equal). A
    chunk's own attention grows with its length, so past t(T)/T's minimum (for
    t = c + b*T + a*T^2, at T = sqrt(c / a)) a larger wave is slower per token before any
    pipeline effect, and through S stages a longer wave costs S - 1 more times its extra time.
    Measured, not fitted: five coefficients fitted over every shape place a flat peak within
    their error (Kimi-K2 on B300: 8,192 and 16,384 tokens 194K tok/s apart by the fit, 216K and
    192K as timed)."""
    best = None
    for chunks, seconds in samples:
        chunks = list(chunks)
        if len(chunks) != 1 or chunks[0][0] != 0 or seconds <= 0:
            continue
        x = chunks[0][1]
        rate = x / seconds
        if best is None or rate > best[0] or (rate == best[0] and x < best[1]):
            best = (rate, x)
    if best is None:
        raise ValueError("peak_wave_tokens needs one-chunk waves from an empty cache")
    return best[1]


def fit_coefficients(samples, knees=None) -> CostCoefficients:
    """Coefficients for measured waves: samples of (chunks, seconds). Least squares on relative
    error (small waves count as much as large ones), costs kept >= 0, and the knee chosen from
    `knees` (default: 0 and every power of two up to the largest wave) by the smallest error."""
    samples = [(list(chunks), float(seconds)) for chunks, seconds in samples if seconds > 0]
    if not samples:
        raise ValueError("fit_coefficients needs samples with positive seconds")
    if knees is None:
        largest = max(sum(x for _, x in chunks) for chunks, _ in samples)
        knees, k = [0.0], 1.0
        while k <= largest:
            knees.append(k)
            k *= 2
    y = np.array([s for _, s in samples])
    best: tuple[float, np.ndarray, float] | None = None
    for knee in knees:
        X = np.array([wave_features(chunks, knee) for chunks, _ in samples]) / _SCALES
        Xw, yw = X / y[:, None], np.ones(len(y))
        w = _nonnegative_lstsq(Xw, yw)
        err = float(np.sum((Xw @ w - yw) ** 2))
        if best is None or err < best[0] - 1e-12:
            best = (err, w, knee)
    assert best is not None  # knees is never empty
    _, w, knee = best
    return CostCoefficients.from_array(w / _SCALES, float(knee))


def _nonnegative_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with negative coefficients pinned at 0, refitting until none is negative."""
    keep = list(range(X.shape[1]))
    w = np.zeros(X.shape[1])
    while keep:
        sol, *_ = np.linalg.lstsq(X[:, keep], y, rcond=None)
        if (sol >= 0).all():
            w[:] = 0.0
            w[keep] = sol
            return w
        keep = [j for j, v in zip(keep, sol) if v > 0]
    return w
