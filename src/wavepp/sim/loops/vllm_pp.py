"""vLLM's pipeline-parallel prefill (the V1 engine) as its code runs it, one switch per difference.

`vllm-pp` is one central scheduler and pool over P execution stages (sim/studies/systems.py); most
of what vLLM's V1 engine does with PP the simulator already does so, and only what differs is a
switch. Paths are in vllm-project/vllm, vllm/ (v0.28.0 is the paper's version; read in the
v0.32 source, where v0.28.0 is not stored).

    mechanism                 vLLM                                           where                         simulator
    max_num_batched_tokens    the step's token budget; on GPUs of 160 GiB    engine/arg_utils.py           switch
                              or more the OpenAI server's default is 16,384  (_get_default_max_num_...:
                              (8,192 on H100/H200-class)                     device_memory >= 160 GiB)
    budget of computed tokens token_budget -= num_new_tokens: the tokens     v1/core/sched/scheduler.py    the same (the static
                              after the prefix cache hit only                Scheduler.schedule            planner packs uncached
                                                                                                           tokens)
    next chunk in flight      num_computed_tokens advances when a chunk is   Scheduler._update_after_      the same (chunks of a
                              scheduled, so a prefill's next chunk goes in   schedule                      request overlap)
                              the next batch while the last one runs
    P batches in flight       batch queue of max_concurrent_batches (the PP  v1/engine/core.py             the same (S batches
                              size): schedule while the queue has room, else EngineCore.step_with_batch_   in flight)
                              block on the oldest                            queue
    one pool, smallest rank   every rank's num_blocks set to the smallest    v1/core/kv_cache_utils.py     the same (central pool,
                              among the ranks                                ("Change the num_blocks of    its size the smallest
                                                                             each rank to the smallest")   stage's)
    reuse visible at schedule full blocks are cached when allocated (at      v1/core/kv_cache_manager.py   the same (in-flight
                              schedule time), before their kernels run       allocate_slots -> cache_blocks blocks are shared)

`VLLM_LEGACY` is this simulator's earlier `vllm-pp` (8,192 tokens); `VLLM_V0280` vLLM v0.28.0 on
288 GB GPUs (GB300, B300). That the 160 GiB default is in v0.28.0 is an assumption from the
v0.32 code and ROCm/MAD#235 (Aug 2026: "VLLM now defaults to 16384").
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class VllmMechanisms:
    """Which of vLLM's behaviours `vllm-pp` runs (the table above); validated here."""

    max_num_batched_tokens: int = 8192

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens <= 0:
            raise ValueError(
                f"VllmMechanisms.max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}"
            )

    def with_changes(self, **changes) -> "VllmMechanisms":
        return replace(self, **changes)


VLLM_LEGACY = VllmMechanisms()
VLLM_V0280 = VllmMechanisms(max_num_batched_tokens=16384)
VLLM_PRESETS = {"legacy": VLLM_LEGACY, "v0.28.0": VLLM_V0280}


def get_vllm(name: str) -> VllmMechanisms:
    if name not in VLLM_PRESETS:
        raise ValueError(f"unknown vllm preset {name!r}; choose one of {', '.join(VLLM_PRESETS)}")
    return VLLM_PRESETS[name]
