"""SGLang's pipeline-parallel prefill as its scheduler runs it, one switchable mechanism at a time.

`sglang-pp` (sim/loops/loop_sim.py) runs `SchedulerPPMixin.event_loop_pp` step by step on every
rank; `SglangMechanisms` says which of the scheduler's behaviours ride on that loop. Paths are in
sgl-project/sglang, python/sglang/srt/ (v0.5.18 is the paper's version).

    switch               SGLang                                                 where
    chunked_prefill_size the batch's token budget for new (uncached) tokens:     server_args.py (chunked_prefill_size:
                         PrefillAdder charges each request its extend_input_len  16,384 on the largest GPUs;
                         (the tokens after its matched prefix), chunks the first max_prefill_tokens 16,384);
                         that does not fit to what is left (page-aligned) and    managers/schedule_policy.py
                         stops; the chunked request's next chunk goes first in   PrefillAdder.add_one_req,
                         the next batch                                          add_chunked_req
    dynamic_chunking     True: the chunk after L tokens costs what the first did server_args.py
                         (a fitted quadratic, smoothed 0.75); False: every batch enable_dynamic_chunking
                         the same budget. Off unless --enable-dynamic-chunking   (default False);
                                                                                 managers/scheduler_pp_mixin.py
    admit_on_schedule    True: a waiting request is matched and its KV allocated managers/scheduler.py
                         only when PrefillAdder takes it into a batch (the       get_new_batch_prefill: for req in
                         requests that fit what the batch has left); False: the  waiting_queue: init_next_round_input,
                         earlier simulator's eager admission of every waiting    add_one_req, break on its first
                         request                                                 refusal
    match_scope          "considered": every scheduling pass walks the radix     managers/schedule_batch.py
                         tree for each waiting request the adder looks at (those Req.init_next_round_input ->
                         it takes and the one it stops at), on every rank (each  tree_cache.match_prefix;
                         rank schedules over its own tree), before the launch;   mem_cache/radix_cache.py
                         "admitted": once per request, when first scheduled      RadixCache.match_prefix
    min_free_memory      True: every rank's pool is sized from the free memory   model_executor/
                         after loading the weights, all-reduced with MIN over    model_runner_kv_cache_mixin.py
                         the world (`get_available_gpu_memory(distributed=True,  (_profile_available_bytes,
                         cpu_group=world)`), divided by the rank's own layers'   profile_max_num_token: its
                         bytes per token: a rank with less weight keeps the      layers, start_layer..end_layer)
                         free memory of the heaviest. False: each rank's own

The cost of a walk is `LoopCosts.match_block_s` (0.5 us) per block of `LoopCosts.block_tokens`
(32) real tokens matched, plus the block where it stops: this project's BlockPool per block, an assumption for SGLang's Python radix tree (no
measurement of it is cited). `SGLANG_LEGACY` is this simulator's earlier `sglang-pp`;
`SGLANG_V0518` SGLang v0.5.18 with its default server arguments (the paper names no flags).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from wavepp.sched.cost_model import CostModel
from wavepp.sched.planners.base import PlannerConfig
from wavepp.sched.planners.dynamic import DynamicChunkPlanner
from wavepp.sched.request import Request
from wavepp.sim.loops.trtllm import blocks_walked

MATCH_SCOPES = ("admitted", "considered")


@dataclass(frozen=True)
class SglangMechanisms:
    """Which of SGLang's behaviours `sglang-pp` runs (the table above); validated here."""

    chunked_prefill_size: int = 16384
    dynamic_chunking: bool = True
    admit_on_schedule: bool = False
    match_scope: str = "admitted"
    min_free_memory: bool = False

    def __post_init__(self) -> None:
        if self.chunked_prefill_size <= 0:
            raise ValueError(
                f"SglangMechanisms.chunked_prefill_size must be positive, got {self.chunked_prefill_size}"
            )
        if self.match_scope not in MATCH_SCOPES:
            raise ValueError(
                f"SglangMechanisms.match_scope must be one of {MATCH_SCOPES}, got {self.match_scope!r}"
            )

    def with_changes(self, **changes) -> "SglangMechanisms":
        return replace(self, **changes)


SGLANG_LEGACY = SglangMechanisms()
SGLANG_V0518 = SglangMechanisms(
    dynamic_chunking=False, admit_on_schedule=True, match_scope="considered", min_free_memory=True
)
# v0.5.18 launched with --enable-dynamic-chunking (SGLang's PP guide suggests it for long prompts;
# the paper does not say whether it was on)
SGLANG_V0518_DYNAMIC = SGLANG_V0518.with_changes(dynamic_chunking=True)
SGLANG_PRESETS = {
    "legacy": SGLANG_LEGACY,
    "v0.5.18": SGLANG_V0518,
    "v0.5.18-dynamic": SGLANG_V0518_DYNAMIC,
}


def get_sglang(name: str) -> SglangMechanisms:
    if name not in SGLANG_PRESETS:
        raise ValueError(
            f"unknown sglang preset {name!r}; choose one of {', '.join(SGLANG_PRESETS)}"
        )
    return SGLANG_PRESETS[name]


def sglang_planner(
    mechanisms: SglangMechanisms, config: PlannerConfig, cost_model: CostModel
) -> DynamicChunkPlanner:
    """PrefillAdder's batches: FCFS up to the budget (`config.static_wave_tokens`, the
    chunked_prefill_size), the request that does not fit cut to what is left; the budget after
    SGLang's dynamic chunking (smooth factor 0.75, SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR) or the
    same every batch (smooth 0: the base)."""
    return DynamicChunkPlanner(
        config, cost_model, smooth=0.75 if mechanisms.dynamic_chunking else 0.0
    )


class SglangScheduling:
    """The mechanisms' state in one `LoopSim` run (`loop="sglang"`): how many waiting requests
    the next batch takes, and what the walks over them cost. Token counts in simulated tokens
    (`token_scale` real tokens each); `match_block_tokens` is the block of
    `LoopCosts.match_block_s` in real tokens."""

    def __init__(
        self,
        mechanisms: SglangMechanisms,
        planner,
        block_size: int,
        match_block_tokens: int,
        match_block_s: float,
        token_scale: int = 1,
    ):
        self.mech, self.planner, self.block_size = mechanisms, planner, block_size
        self.match_block_tokens, self.match_block_s = max(1, match_block_tokens), match_block_s
        self.token_scale = token_scale

    def round_size(self, leader, matched_tokens) -> int | None:
        """How many waiting requests PrefillAdder takes into the next batch (None: all, the
        earlier eager admission). The running requests' next chunks go first; then each waiting
        request, in order, is charged its uncached tokens (`matched_tokens(req)` are cached),
        cut to what is left, until nothing page-sized is left."""
        if not self.mech.admit_on_schedule:
            return None
        bs = self.block_size
        left = self.budget(leader.plannable)
        for req in leader.plannable:
            left -= min(req.num_unscheduled_tokens, max(0, left))
        count = 0
        for req in leader.waiting:
            if left < bs:
                break
            left -= min(req.num_tokens - matched_tokens(req), left)
            count += 1
        return count

    def budget(self, running: Sequence[Request]) -> int:
        """The batch's token budget: the planner's next chunk (dynamic chunking sizes it after
        the running request's tokens so far)."""
        first = next(iter(running), None)
        return self.planner.chunk_budget(first.num_scheduled_tokens if first is not None else 0)

    def considered_match_s(self, leader, taken: int | None, matched_tokens) -> float:
        """Seconds of one pass's walks ("considered"): each waiting request the adder takes and
        the one it stops at, each walk over its matched blocks and the block where it misses."""
        if self.mech.match_scope != "considered":
            return 0.0
        waiting = list(leader.waiting)
        looked = waiting if taken is None else waiting[: taken + 1]
        return sum(self.walk_s(matched_tokens(r), r.num_tokens) for r in looked)

    def walk_s(self, num_cached: int, num_tokens: int) -> float:
        """One walk down a prompt of `num_tokens` with `num_cached` matched (simulated tokens):
        each matched block and the one where it misses, blocks of real tokens."""
        s = self.token_scale
        return self.match_block_s * blocks_walked(
            num_cached * s, num_tokens * s, self.match_block_tokens
        )
