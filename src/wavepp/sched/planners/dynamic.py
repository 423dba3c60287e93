"""SGLang's dynamic chunking for pipeline-parallel prefill, as a planner (the `sglang-pp`
baseline).

SGLang (blog "Pipeline Parallelism in SGLang", LMSYS, 2026-01-15) profiles the cumulative
prefill latency of a sequence as a quadratic f(l) = a*l^2 + b*l + c and sizes the next chunk
of the request being chunked, after its L tokens so far, so that it costs what the initial
chunk did:

    f(L + x) - f(L) = f(base) - f(0)     ->   a*x^2 + (2*a*L + b)*x - (a*base^2 + b*base) = 0

The prediction is smoothed toward the base size by the smooth factor sigma (SGLANG_DYNAMIC_
CHUNKING_SMOOTH_FACTOR, default 0.75; 1 follows the model, 0 is fixed chunking), floored at
base/4 and aligned down to the page (block) size. The wave is then packed first-come-first-
served up to that budget, as SGLang's prefill adder fills a batch.

f is the cost model's t(0, l) = c0 + b*l + a*l^2 (only a and b enter), taken once: SGLang
fits at warm-up and keeps it (`observe` does nothing). SGLang's own fit is `fit_warmup`, over
the prefills `warmup_lengths` lists (`SchedulerPPMixin.profile_and_init_predictor` and
`ChunkSizePredictor.fit` in python/sglang/srt/managers/scheduler_pp_mixin.py): the simulator
gives the `sglang-pp` baseline that, not this project's profiling fit.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from wavepp.sched.cost_model import CostCoefficients, CostModel
from wavepp.sched.messages import Chunk
from wavepp.sched.planners.base import NOTHING_ADMITTING, Admitting, PlannerConfig, pack_tokens
from wavepp.sched.request import Request


class DynamicChunkPlanner:
    name = "dynamic"

    def __init__(
        self, config: PlannerConfig, cost_model: CostModel | None = None, smooth: float = 0.75
    ):
        if not 0.0 <= smooth <= 1.0:
            raise ValueError(f"DynamicChunkPlanner.smooth must be in [0, 1], got {smooth}")
        self.config = config
        self.cost = cost_model or CostModel()
        self.smooth = smooth
        self.base = config.static_wave_tokens

    def chunk_budget(self, num_cached: int) -> int:
        """Tokens of the next chunk after `num_cached` tokens of the chunked request."""
        a, b = self.cost.coef.a, self.cost.coef.b
        base, L = self.base, num_cached
        target = a * base * base + b * base
        lin = 2 * a * L + b
        if a > 0:
            x = 2 * target / (lin + math.sqrt(lin * lin + 4 * a * target))  # stable positive root
        else:
            x = target / lin if lin > 0 else float(base)
        x = base + self.smooth * (x - base)
        x = max(x, base / 4)
        bs = self.config.block_size
        return max(bs, int(x) // bs * bs)

    def plan(
        self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING
    ) -> list[Chunk]:
        if not requests:
            return []
        budget = self.chunk_budget(requests[0].num_scheduled_tokens)
        return pack_tokens(requests, budget, self.config, self.config.block_size)

    def observe(self, chunks, seconds: float) -> None:
        pass


def warmup_lengths(base_tokens: int) -> list[int]:
    """SGLang's warm-up prefills: 128 single prompts, each from an empty cache, evenly spaced
    from 1.25 times the base chunk down (20,480, 20,320, ..., 160 for a base of 16,384)."""
    top = base_tokens * 1.25
    step = top // 128
    return [n for n in (int(top - i * step) for i in range(128)) if n > 0]


def fit_warmup(lengths: Sequence[int], seconds: Sequence[float]) -> CostCoefficients:
    """SGLang's fit of its warm-up prefills: f(l) = a*l^2 + b*l + c by least squares; a must be
    positive (else SGLang refuses to start), a negative b is taken as 0. As cost coefficients
    t(0, l) = c0 + b*l + a*l^2: no per-wave, prefix or knee term (c0 = c, at least 0; the
    chunking reads only a and b)."""
    if len(lengths) != len(seconds) or len(lengths) < 8:
        raise ValueError(
            f"fit_warmup needs at least 8 (length, seconds) pairs, got {len(lengths)} and {len(seconds)}"
        )
    k = np.asarray(lengths, dtype=np.float64) / 1e3  # in thousands: a well-conditioned fit
    X = np.column_stack([k * k, k, np.ones_like(k)])
    (a, b, c), *_ = np.linalg.lstsq(X, np.asarray(seconds, dtype=np.float64), rcond=None)
    a, b = a / 1e6, b / 1e3
    if a <= 0:
        raise ValueError(f"fit_warmup: the quadratic coefficient a={a:.3e} is not positive")
    return CostCoefficients(
        c_wave=0.0, c0=max(0.0, float(c)), g=0.0, b=max(0.0, float(b)), a=float(a)
    )
