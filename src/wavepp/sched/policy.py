"""Policies: when admission runs, and which planner sizes the waves.

Each baseline differs from `wavepp` in exactly one mechanism:

    policy       admission                          planner
    wavepp       asynchronous (WAVE, beside LOOP)   balanced (fitted cost model)
    wavepp-mpu   asynchronous                       mpu (the paper's budget halving)
    lockstep     inline: between waves, on LOOP     balanced
    static       asynchronous                       static (fixed token budget)
    sglang-pp    inline                             dynamic (SGLang's dynamic chunking)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    name: str
    inline_admission: bool
    planner: str
    description: str


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("wavepp", False, "balanced", "asynchronous admission, cost-balanced waves"),
    Policy("wavepp-mpu", False, "mpu", "asynchronous admission, the paper's MPU budgets"),
    Policy("lockstep", True, "balanced", "admission inline between waves (TensorRT-LLM PP style)"),
    Policy("static", False, "static", "fixed token budget per wave (vLLM style)"),
    Policy("sglang-pp", True, "dynamic", "inline admission, SGLang's dynamic chunk sizes"),
)}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
