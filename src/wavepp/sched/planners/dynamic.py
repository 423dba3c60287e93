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

Here f comes from the cost model's fit, t(0, l) = c0 + b*l + a*l^2, taken once (SGLang fits
at warmup and keeps it).
"""

from __future__ import annotations

import math
from typing import Sequence

from wavepp.sched.cost_model import CostModel
from wavepp.sched.messages import Chunk
from wavepp.sched.planners.base import NOTHING_ADMITTING, Admitting, PlannerConfig, pack_tokens
from wavepp.sched.request import Request


class DynamicChunkPlanner:
    name = "dynamic"

    def __init__(self, config: PlannerConfig, cost_model: CostModel | None = None,
                 smooth: float = 0.75):
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
            x = 2 * target / (lin + math.sqrt(lin * lin + 4 * a * target))   # stable positive root
        else:
            x = target / lin if lin > 0 else float(base)
        x = base + self.smooth * (x - base)
        x = max(x, base / 4)
        bs = self.config.block_size
        return max(bs, int(x) // bs * bs)

    def plan(self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING) -> list[Chunk]:
        if not requests:
            return []
        budget = self.chunk_budget(requests[0].num_scheduled_tokens)
        return pack_tokens(requests, budget, self.config, self.config.block_size)

    def observe(self, chunks, seconds: float) -> None:
        pass
