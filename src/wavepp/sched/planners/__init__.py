"""Wave planners: which chunks of which admitted requests form the next wave, and how long each
chunk is. Each planner is one module over `base` (its config, the `Planner` interface, the chunk
arithmetic); they differ in the size of a wave:

    static    a fixed token budget (vLLM's max_num_batched_tokens style)        static.py
    mpu       the paper's budget halving with hysteresis, from the available   mpu.py
              work
    balanced  a fitted cost model: each wave takes an equal share of all the   balanced.py
              work in the system, waiting and in flight, over `target_waves`
              waves; it holds back thin waves while the pipeline is full
    dynamic   SGLang's dynamic chunking: the chunked request's next chunk      dynamic.py
              costs what the initial chunk did, by a fitted quadratic

Hybrid models: every planner's wave then goes through `align_chunk_ends` (snapshot_align.py).

`PLANNERS` maps a name to its factory, `factory(config, **kwargs)`; `make_planner` looks the
name up when it is called, so a factory registered under a name replaces that planner for
every later `make_planner`.
"""

from __future__ import annotations

from typing import Callable

from wavepp.sched.planners.balanced import BalancedPlanner
from wavepp.sched.planners.balanced_rules import ALL_RULES, BalancedRules
from wavepp.sched.planners.base import (
    MPU_PAPER_TOKENS,
    NOTHING_ADMITTING,
    Admitting,
    Planner,
    PlannerConfig,
    align_down,
    chunk_of,
    first_tokens,
    pack_tokens,
)
from wavepp.sched.planners.dynamic import DynamicChunkPlanner
from wavepp.sched.planners.mpu import MpuPlanner, budget_ladder
from wavepp.sched.planners.snapshot_align import align_chunk_ends
from wavepp.sched.planners.static import StaticPlanner

PLANNERS: dict[str, Callable[..., Planner]] = {
    "static": StaticPlanner,
    "mpu": MpuPlanner,
    "balanced": BalancedPlanner,
    "dynamic": DynamicChunkPlanner,
}


def make_planner(name: str, config: PlannerConfig, **kwargs) -> Planner:
    try:
        factory = PLANNERS[name]
    except KeyError:
        raise ValueError(f"unknown planner {name!r}; choose one of {sorted(PLANNERS)}") from None
    return factory(config, **kwargs)


__all__ = [
    "PLANNERS",
    "make_planner",
    "Planner",
    "PlannerConfig",
    "Admitting",
    "NOTHING_ADMITTING",
    "MPU_PAPER_TOKENS",
    "StaticPlanner",
    "MpuPlanner",
    "BalancedPlanner",
    "BalancedRules",
    "ALL_RULES",
    "DynamicChunkPlanner",
    "budget_ladder",
    "align_down",
    "chunk_of",
    "first_tokens",
    "pack_tokens",
    "align_chunk_ends",
]
