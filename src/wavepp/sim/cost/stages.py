"""Stage layout on real hardware: which layers each stage holds, and how many KV blocks fit.

Layers are split into contiguous stages that minimize the slowest stage's time (the runtime's
`balanced_split`, models/spec/layer_split.py), as a deployment would balance them, or by count
(`SimSetup.layer_split="even"`, as vLLM's default). A layer's time is taken on the workload's
own waves where it is known (`packed_waves`: the workload's prompts, their reusable prefixes
skipped, packed first come first served into waves of the planner's size: at 128K tokens an
attention layer costs several times a linear-attention one, at 8K about the same), else on
`REFERENCE_WAVE`.
The pool of a stage is what HBM leaves after its weights and an activation reserve, divided
by the KV bytes a token adds to the stage's layers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from wavepp.models.spec import LayerCosts, StageSplit, split_layers
from wavepp.sim.cost.execution import DEFAULT_EXECUTION, Execution
from wavepp.sim.cost.hardware import HardwareSpec
from wavepp.sim.cost.model_shapes import ModelShape
from wavepp.sim.cost.stage_cost import ExecOverheads, StageCostModel, kv_split

# the waves whose per-layer cost balances the stages by default: one chunk of 8,192 new tokens
# after 8,192 cached
REFERENCE_WAVE = (((8192, 8192),),)
Waves = Sequence[Sequence[tuple[int, int]]]  # per wave its chunks' (num_cached, num_new), real


def packed_waves(prompts: Sequence[tuple[int, int]], wave_tokens: int) -> tuple:
    """The waves a planner filling `wave_tokens` new tokens a wave, first come first served,
    runs `prompts` as: each prompt (its tokens, its cached prefix) computes the tokens after
    its prefix, in chunks cut where a wave fills. Each wave is a tuple of chunks
    (num_cached, num_new), real tokens."""
    if wave_tokens <= 0:
        raise ValueError(f"packed_waves needs wave_tokens > 0, got {wave_tokens}")
    waves, wave, room = [], [], wave_tokens
    for tokens, cached in prompts:
        if not 0 <= cached < tokens:
            raise ValueError(f"packed_waves: a prompt of {tokens} tokens with {cached} cached")
        start = cached
        while start < tokens:
            take = min(room, tokens - start)
            wave.append((start, take))
            start, room = start + take, room - take
            if room == 0:
                waves.append(tuple(wave))
                wave, room = [], wave_tokens
    if wave:
        waves.append(tuple(wave))
    return tuple(waves)


@dataclass(frozen=True)
class MemoryBudget:
    # vLLM's default gpu_memory_utilization (0.9): the rest goes to the CUDA context, NCCL
    # buffers and fragmentation.
    memory_fraction: float = 0.9
    activation_reserve_gb: float = 16.0  # assumption: activations of a 32k-token wave + workspace

    def __post_init__(self) -> None:
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(
                f"MemoryBudget.memory_fraction must be in (0, 1], got {self.memory_fraction}"
            )
        if self.activation_reserve_gb < 0:
            raise ValueError("MemoryBudget.activation_reserve_gb must be >= 0")


def partition_layers(
    model: ModelShape,
    hw: HardwareSpec,
    num_stages: int,
    method: str = "auto",
    waves: Waves = REFERENCE_WAVE,
) -> list[tuple[int, int]]:
    """Contiguous [start, end) per stage: "auto" (the runtime's `layer_split="auto"`), the
    split whose largest stage cost on `waves` is the smallest (`balanced_split`: each layer's
    cost, the LM head counted on the last stage); "even", the count split."""
    n = model.num_layers
    if not 1 <= num_stages <= n:
        raise ValueError(f"cannot split {n} layers into {num_stages} stages")
    if method == "even":
        return split_layers(n, num_stages)
    if method != "auto":
        raise ValueError(f"layer split method must be 'auto' or 'even', got {method!r}")
    sizes = layer_costs(model, hw, waves).balanced(num_stages)
    starts = [sum(sizes[:i]) for i in range(num_stages)]
    return [(start, start + size) for start, size in zip(starts, sizes)]


def layer_costs(model: ModelShape, hw: HardwareSpec, waves: Waves = REFERENCE_WAVE) -> LayerCosts:
    """Each layer's seconds over `waves`, each run alone (no wave or chunk overheads: every
    stage has them), and the LM head's on the last stage."""
    none = ExecOverheads(wave_s=0.0, chunk_s=0.0)
    n = model.num_layers
    counts = Counter(tuple(w) for w in waves)  # a workload's waves repeat: each costed once

    def seconds(cost: StageCostModel) -> float:
        return sum(k * cost.wave_seconds(w) for w, k in counts.items())

    layers = [seconds(StageCostModel(model, hw, i, i + 1, overheads=none)) for i in range(n)]
    last = StageCostModel(model, hw, n - 1, n, last=True, overheads=none)
    head = sum(k * last.breakdown(w).get("lm_head", 0.0) for w, k in counts.items())
    return LayerCosts(tuple(layers), 0.0, head, "s", "simulator")


def compare_splits(
    model: ModelShape, hw: HardwareSpec, num_stages: int, waves: Waves = REFERENCE_WAVE
) -> list[str]:
    """The balanced split beside the even one, one line each, with each stage's predicted
    share of the work on `waves` and the slowest stage over the mean."""
    costs = layer_costs(model, hw, waves)
    return [
        f"{model.name} on {num_stages} x {hw.name}: "
        + StageSplit(
            tuple(b - a for a, b in partition_layers(model, hw, num_stages, method, waves)),
            method,
            costs,
        ).describe()
        for method in ("auto", "even")
    ]


DEFAULT_OVERHEADS = ExecOverheads()  # frozen: one shared default


def stage_models(
    model: ModelShape,
    hw: HardwareSpec,
    bounds: Sequence[tuple[int, int]],
    *,
    degree: int = 1,
    overheads: ExecOverheads = DEFAULT_OVERHEADS,
    num_nodes: int = 1,
    layout: str = "tp",
    execution: Execution = DEFAULT_EXECUTION,
) -> list[StageCostModel]:
    """One cost model per stage; `degree` devices per stage, spanning `num_nodes` nodes, sharing
    its layers in `layout`, run as `execution` says (sim/cost/stage_cost.py)."""
    last = len(bounds) - 1
    return [
        StageCostModel(
            model,
            hw,
            a,
            b,
            first=s == 0,
            last=s == last,
            degree=degree,
            overheads=overheads,
            num_nodes=num_nodes,
            layout=layout,
            execution=execution,
        )
        for s, (a, b) in enumerate(bounds)
    ]


def stage_weight_bytes(
    model: ModelShape,
    start: int,
    end: int,
    *,
    first: bool,
    last: bool,
    degree: int = 1,
    layout: str = "tp",
) -> float:
    """Weight bytes on one device of the stage: tp splits them all over `degree`; dp splits
    only the routed experts and replicates the rest (attention, dense MLPs, shared experts,
    routers, embedding and LM head)."""
    embed = model.vocab_size * model.hidden_size * 2.0  # bf16 embedding / lm head
    embed *= int(first) + int(last)
    attention = sum(model.attention_weight_bytes(i) for i in range(start, end))
    if layout != "dp":
        mlp = sum(model.mlp_params(i) for i in range(start, end))
        return (attention + mlp * model.weight_bytes + embed) / degree
    routed = model.num_experts * model.expert_params()
    mlp = 0.0
    for i in range(start, end):
        mlp += model.mlp_params(i) - (routed * (1.0 - 1.0 / degree) if model.is_moe(i) else 0.0)
    return attention + mlp * model.weight_bytes + embed


def stage_kv_tokens(
    model: ModelShape,
    hw: HardwareSpec,
    start: int,
    end: int,
    *,
    first: bool,
    last: bool,
    degree: int = 1,
    budget: MemoryBudget = MemoryBudget(),
    layout: str = "tp",
) -> int:
    """Tokens of KV cache one stage holds (`kv_split`: its devices' together under dp)."""
    weights = stage_weight_bytes(
        model, start, end, first=first, last=last, degree=degree, layout=layout
    )
    free = hw.hbm_gb * 1e9 * budget.memory_fraction - weights - budget.activation_reserve_gb * 1e9
    if free <= 0:
        raise ValueError(
            f"{model.name} layers [{start}, {end}) need {weights / 1e9:.0f} GB of "
            f"weights per device; {hw.name} has {hw.hbm_gb:g} GB"
        )
    per_token = model.layers_kv_bytes_per_token(start, end) / kv_split(model, degree, layout)
    if per_token == 0:  # only linear-attention layers: state, not per-token KV
        return 1 << 40
    return int(free / per_token)
