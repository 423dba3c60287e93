"""The leader a policy gets on this runtime: its planner's budgets, an outside loop's slots and
serial chunks, and the cost model the profiling pass fitted."""

from __future__ import annotations

from wavepp.runtime.profile import WaveProfile
from wavepp.sched import Leader, LeaderConfig, PlannerConfig, Policy, make_planner
from wavepp.sched.cost_model import CostModel
from wavepp.sched.policy import loop_leader_args, loop_planner_args

RUNTIME_MPU_TOKENS = (512, 256)  # (microbatch M, b_min) of wavepp-mpu on the CPU runtime


def build_runtime_leader(
    policy: Policy,
    *,
    num_stages: int,
    block_size: int,
    stage_num_blocks: tuple[int, ...],
    max_prompt_tokens: int,
    hybrid: bool,
    snapshot_interval_blocks: int,
    snapshot_align_frac: float,
    profile: WaveProfile | None,
    scheduling_policy: str = "fcfs",
    priority_aging_s: float = 10.0,
) -> Leader:
    """A new Leader (no request, no round) for `policy` over stages of `stage_num_blocks`,
    admitting and packing in `scheduling_policy`'s order (sched/waiting.py)."""
    loop = policy.loop  # an outside loop's budget, slots and serial chunks
    # MPU's paper budgets (16,384 / 8,192) in the ratio of this runtime's 512-token waves
    pcfg = PlannerConfig(
        block_size=block_size,
        num_stages=num_stages,
        mpu_microbatch_tokens=RUNTIME_MPU_TOKENS[0],
        mpu_min_tokens=RUNTIME_MPU_TOKENS[1],
        snapshot_interval_blocks=snapshot_interval_blocks,
        snapshot_align_frac=snapshot_align_frac,
        **loop_planner_args(loop),
    )
    # the cost-model planners start from the profiling pass's fit, then refine it online
    profiled = profile is not None and policy.planner in ("balanced", "dynamic")
    kwargs = {"cost_model": CostModel(profile.coefficients)} if profiled else {}
    return Leader(
        LeaderConfig(
            num_stages,
            block_size,
            stage_num_blocks=stage_num_blocks,
            max_prompt_tokens=max_prompt_tokens,
            hybrid=hybrid,
            scheduling_policy=scheduling_policy,
            priority_aging_s=priority_aging_s,
            **loop_leader_args(loop, num_stages),
        ),
        make_planner(policy.planner, pcfg, **kwargs),
    )
