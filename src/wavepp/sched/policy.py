"""Policies: when admission runs, which planner sizes the waves, and where each one runs.

Each in-house baseline differs from `wavepp` in exactly one mechanism; the outside loops
(`sglang-pp`, `trtllm-pp`) follow another framework's executor loop as a whole:

    policy       admission                          planner                        runs in
    wavepp       asynchronous (WAVE, beside LOOP)   balanced (fitted cost model)   runtime, simulator
    wavepp-mpu   asynchronous                       mpu (the paper's budgets)      runtime, simulator
    lockstep     inline: between waves, on LOOP     balanced                       runtime, simulator
    static       asynchronous                       static (fixed token budget)    runtime, simulator
    sglang-pp    SGLang's event_loop_pp: a round    dynamic (SGLang's chunking;    runtime, simulator
                 with every stage before each       base 16,384; 512 on the
                 microbatch, P slots, outputs       runtime)
                 retired a slot later
    trtllm-pp    TensorRT-LLM's _executor_loop_pp:  static (max_num_tokens 8,192;  runtime, simulator
                 as sglang-pp, and a request has    256 on the runtime)
                 one chunk in flight
    vllm-pp      one central scheduler and pool     static                         simulator
    tp-ep        one scheduler, every device on     static                         simulator
                 every layer
    dp-ep        as tp-ep with data-parallel        static                         simulator
                 attention (DP attention, EP experts)
    fixed-*      the paper's ablation steps         static                         simulator

The outside loops (`loop`) run step by step on every rank in the simulator
(sim/loops/loop_sim.py) and as rank 0's iteration on the runtime (runtime/outside_loop.py).

The bench adds `single-stage` (the runtime with one stage: the pipelining reference). The CLI's
choices, the bench's list and the simulator's systems (sim/studies/systems.py) all come from
here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    name: str
    inline_admission: bool
    planner: str
    description: str
    in_runtime: bool = True  # False: a topology only the simulator models
    loop: str | None = None  # an outside framework's executor loop: trtllm | sglang


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("wavepp", False, "balanced", "asynchronous admission, cost-balanced waves"),
        Policy("wavepp-mpu", False, "mpu", "asynchronous admission, the paper's MPU budgets"),
        Policy(
            "lockstep", True, "balanced", "admission inline between waves, only when requests wait"
        ),
        Policy("static", False, "static", "fixed token budget per wave (vLLM style)"),
        Policy(
            "sglang-pp",
            True,
            "dynamic",
            "SGLang's PP event loop, dynamic chunk sizes",
            loop="sglang",
        ),
        Policy(
            "trtllm-pp",
            True,
            "static",
            "TensorRT-LLM's PP executor loop, fixed-budget microbatches",
            loop="trtllm",
        ),
        Policy(
            "vllm-pp", True, "static", "central scheduler and pool, fixed budget", in_runtime=False
        ),
        Policy(
            "tp-ep",
            True,
            "static",
            "one scheduler, fixed budget, TP/EP over all devices",
            in_runtime=False,
        ),
        Policy(
            "dp-ep",
            True,
            "static",
            "one scheduler, fixed budget per rank, DP attention and EP experts over all devices",
            in_runtime=False,
        ),
        # the simulator's ablation of the paper, one mechanism at a time (sim/studies/systems.py)
        Policy(
            "fixed-lockstep",
            True,
            "static",
            "ablation: inline admission, fixed budget",
            in_runtime=False,
        ),
        Policy(
            "fixed-wave",
            False,
            "static",
            "ablation: + wave admission, lease and escrow not charged",
            in_runtime=False,
        ),
        Policy("fixed-lease", False, "static", "ablation: + lease and escrow", in_runtime=False),
    )
}

# TensorRT-LLM's max_num_tokens of 8,192 per microbatch, in the ratio of the runtime's 512-token
# waves to the paper's 16,384 (as RUNTIME_MPU_TOKENS in runtime/runtime_leader.py); SGLang's
# base chunk of 16,384 is the planner's default 512 there (PlannerConfig.static_wave_tokens)
RUNTIME_TRTLLM_TOKENS = 256


def loop_planner_args(loop: str | None) -> dict:
    """PlannerConfig fields of an outside loop's planner on the CPU runtime."""
    return {"static_wave_tokens": RUNTIME_TRTLLM_TOKENS} if loop == "trtllm" else {}


def loop_leader_args(loop: str | None, num_stages: int) -> dict:
    """LeaderConfig fields of an outside loop: P microbatch slots; serial chunks under trtllm."""
    if loop is None:
        return {}
    return {"max_waves_in_flight": num_stages, "serial_chunks": loop == "trtllm"}


SINGLE_STAGE = "single-stage"  # the bench's pipelining reference: the runtime at pp = 1


def runtime_policies() -> list[str]:
    """Policies the runtime (Engine, prefill) runs."""
    return [p.name for p in POLICIES.values() if p.in_runtime]


def bench_policies() -> list[str]:
    """What `wavepp bench --policy` takes: the runtime's policies and single-stage."""
    return runtime_policies() + [SINGLE_STAGE]


def simulator_policies() -> list[str]:
    return list(POLICIES)


def get_policy(name: str, *, runtime: bool = False) -> Policy:
    """The policy called `name`; with `runtime`, only one the runtime runs. An unknown name
    raises ValueError listing the valid ones."""
    valid = runtime_policies() if runtime else simulator_policies()
    if name not in valid:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(valid)}")
    return POLICIES[name]


def check_policies(names: list[str], valid: list[str]) -> list[str]:
    """`names` if each is valid, else ValueError naming the first unknown one and the choices."""
    if not names:
        raise ValueError(f"no policy given; choose from {', '.join(valid)}")
    for name in names:
        if name not in valid:
            raise ValueError(f"unknown policy {name!r}; choose from {', '.join(valid)}")
    return names
