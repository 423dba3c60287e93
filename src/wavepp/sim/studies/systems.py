"""The systems the simulator compares, each the same leader code in a different arrangement.

    system      admission                      planner (wave size)           topology
    wavepp      asynchronous rounds (WAVE)     balanced cost model           PP, pool per stage
    wavepp-mpu  asynchronous rounds            the paper's MPU budgets       PP, pool per stage
    lockstep    inline rounds between waves    balanced cost model (the      PP, pool per stage
                                               same planner and fit as wavepp)
    static      asynchronous rounds            fixed budget                  PP, pool per stage
    sglang-pp   SGLang's event_loop_pp         SGLang dynamic chunking       PP, pool per stage,
                                               (fitted by SGLang's own       S micro-batches
                                               warm-up)
    trtllm-pp   TensorRT-LLM's                 fixed budget (8192)           PP, pool per stage,
                _executor_loop_pp                                            S micro-batches
    vllm-pp     one central scheduler, local   fixed budget (8192)           PP, one pool sized to
                (no cross-stage round)                                       the smallest stage,
                                                                             S batches in flight
    tp-ep       one scheduler, local           fixed budget (16384)          every device on every
                                                                             layer (TP attention,
                                                                             EP experts)
    dp-ep       one scheduler, local           fixed budget (16384 per       every device on every
                                               device)                       layer (DP attention,
                                                                             EP experts)

dp-ep is the layout of SGLang's and TensorRT-LLM's large-EP prefill recipes (SGLang's
--enable-dp-attention with DeepEP; "DEP"): each device runs its own requests through attention
and exchanges tokens only with the experts' devices (sim/cost/stage_cost.py `layout`), the
exchange of one micro-batch beside the other's compute (two-batch overlap, SGLang's recipe;
sim/cost/execution.py). Its one
scheduler and pool stand for the devices' own (requests spread evenly, the pool the devices' pools
together); its budget is per device, SGLang's chunked_prefill_size divided among the
data-parallel ranks (16,384 each in SGLang's large-scale EP prefill recipe).

`SimSetup.budget_tokens` (`--budget-tokens`) replaces the fixed budget of static, trtllm-pp,
vllm-pp, tp-ep and dp-ep (per device for dp-ep).

The paper's ablation adds one mechanism at a time on MPU's 16,384-token microbatch:
fixed-lockstep (inline rounds, fixed waves) -> fixed-wave (asynchronous rounds; the stages'
lease and escrow work is not charged: an upper bound for wave admission alone, since this
leader cannot admit without them) -> fixed-lease (that work charged) -> wavepp-mpu (MPU
budgets) -> wavepp (the balanced planner).

sglang-pp and trtllm-pp run those frameworks' pipeline loops step by step (sim/loops/loop_sim.py),
with their per-iteration host costs (`LoopCosts`). The fixed budgets are the frameworks' defaults:
TensorRT-LLM's max_num_tokens of 8192 per microbatch (tensorrt_llm/llmapi/llm_args.py); vLLM's max_num_batched_tokens of 8192 for its
OpenAI server on large GPUs (vllm/engine/arg_utils.py); SGLang's chunked_prefill_size of 16384
on GPUs with the most memory (sglang/srt/server_args.py), also the base chunk of its dynamic
chunking. Those are the `legacy` presets of `SimSetup.sglang` and `SimSetup.vllm`; the paper's
versions are presets too (sim/loops/sglang.py `SGLANG_V0518`: fixed chunks, admission and radix
walks on schedule; sim/loops/vllm_pp.py `VLLM_V0280`: 16,384 tokens on GPUs of 160 GiB or more).
"""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.sched.policy import Policy, get_policy
from wavepp.sim.cost.execution import DEFAULT_EXECUTION, Execution


@dataclass(frozen=True)
class SystemSpec:
    name: str
    policy: Policy
    topology: str  # "pp" | "central" (one pool) | "tp" (one stage of all devices)
    ring_per_stage: int  # waves in flight per execution stage
    chunk_tokens: int | None  # fixed / base budget in real tokens (static, dynamic planners)
    description: str
    lease_escrow: bool = True  # charge the stages' lease and escrow work in admission rounds
    loop: str | None = None  # an outside executor loop (sim/loops/loop_sim.py): trtllm | sglang
    # wavepp's own runtime (its stage caches and escrow): offloads to a host KV tier where the
    # setup has one (`SimSetup.host_kv_gib`); the baselines only with `host_tier_for_baselines`
    host_tier: bool = False
    layout: str = (
        "tp"  # topology "tp": how the devices share the layers (sim/cost/stage_cost.py LAYOUTS)
    )
    # how its forward runs beyond the kernels (sim/cost/execution.py): overlap, expert placement
    execution: Execution = DEFAULT_EXECUTION

    def __post_init__(self) -> None:
        if self.topology not in ("pp", "central", "tp"):
            raise ValueError(
                f"SystemSpec.topology must be pp, central or tp, got {self.topology!r}"
            )
        if self.ring_per_stage <= 0:
            raise ValueError("SystemSpec.ring_per_stage must be positive")


SYSTEMS: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        SystemSpec(
            "wavepp",
            get_policy("wavepp"),
            "pp",
            2,
            None,
            "asynchronous admission, cost-balanced waves, 2S waves in flight",
            host_tier=True,
        ),
        SystemSpec(
            "wavepp-mpu",
            get_policy("wavepp-mpu"),
            "pp",
            2,
            None,
            "asynchronous admission, the paper's MPU budget halving",
            host_tier=True,
        ),
        SystemSpec(
            "lockstep",
            get_policy("lockstep"),
            "pp",
            2,
            None,
            "admission rounds inline between waves",
            host_tier=True,
        ),
        SystemSpec(
            "static",
            get_policy("static"),
            "pp",
            2,
            8192,
            "asynchronous admission, fixed budget",
            host_tier=True,
        ),
        SystemSpec(
            "sglang-pp",
            get_policy("sglang-pp"),
            "pp",
            1,
            16384,
            "SGLang's event_loop_pp, dynamic chunking (sigma 0.75), S micro-batches",
            loop="sglang",
        ),
        SystemSpec(
            "trtllm-pp",
            get_policy("trtllm-pp"),
            "pp",
            1,
            8192,
            "TensorRT-LLM's _executor_loop_pp, 8192-token microbatches, S slots",
            loop="trtllm",
        ),
        SystemSpec(
            "vllm-pp",
            get_policy("vllm-pp"),
            "central",
            1,
            8192,
            "one scheduler and pool (smallest stage), S batches in flight",
        ),
        SystemSpec(
            "tp-ep",
            get_policy("tp-ep"),
            "tp",
            2,
            16384,
            "all devices on every layer: TP attention, EP experts",
        ),
        SystemSpec(
            "dp-ep",
            get_policy("dp-ep"),
            "tp",
            2,
            16384,
            "all devices on every layer: DP attention, EP experts",
            layout="dp",
            # SGLang's large-scale EP prefill recipe: two-batch overlap over DeepEP
            execution=Execution(overlap="tbo"),
        ),
        # the paper's ablation, one mechanism at a time, on MPU's 16,384-token microbatch
        SystemSpec(
            "fixed-lockstep",
            get_policy("fixed-lockstep"),
            "pp",
            2,
            16384,
            "ablation base: admission inline between waves, fixed 16,384-token waves",
            host_tier=True,
        ),
        SystemSpec(
            "fixed-wave",
            get_policy("fixed-wave"),
            "pp",
            2,
            16384,
            "ablation: + wave admission (lease and escrow work not charged)",
            lease_escrow=False,
            host_tier=True,
        ),
        SystemSpec(
            "fixed-lease",
            get_policy("fixed-lease"),
            "pp",
            2,
            16384,
            "ablation: + lease and escrow (their work charged)",
            host_tier=True,
        ),
    )
}

ABLATION = ("fixed-lockstep", "fixed-wave", "fixed-lease", "wavepp-mpu", "wavepp")


def get_system(name: str) -> SystemSpec:
    return SYSTEMS[get_policy(name).name]


# the systems whose fixed budget `SimSetup.budget_tokens` replaces
BUDGETED = ("static", "trtllm-pp", "vllm-pp", "tp-ep", "dp-ep")
