"""How a system runs a stage's forward beyond its kernels' math: what differs between systems on
the same hardware (sim/cost/stage_cost.py takes one).

    overlap          "none": every kernel on one stream, the exchange after the compute it
                     waits for. "tbo": two micro-batches (SGLang's two-batch overlap, DeepSeek's
                     dual micro-batch, vLLM's DBO), each one's dispatch and combine beside the
                     other's compute: the exchange hides behind compute, but while its kernels
                     run they hold `COMM_SMS` of the GPU's SMs, and compute runs on the rest
    placement        the routed experts' placement (sim/cost/expert_balance.py): "default",
                     "eplb" (redundant experts placed from measured loads) or "perfect"
    streamed_experts the share of each device's routed-expert weights that does not fit in HBM
                     and is streamed in from host memory every forward, prefetched beside
                     compute (SGLang's and vLLM's weight offloading on Grace-Blackwell): the
                     forward takes at least that transfer over the host link

With overlap, compute of C seconds (at the whole GPU) beside an exchange of X seconds ends after
max(C * num_sms / (num_sms - COMM_SMS), X): DeepEP's kernels hold their SMs for the whole layer
(in DeepSeek's prefill profile the communication stream is busy, mostly waiting, about 89% of
each layer), so compute runs on the rest throughout. The micro-batches' smaller GEMMs, and a
micro-batch's first dispatch with nothing to hide it, are not charged.
"""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.sim.cost.expert_balance import PLACEMENTS

OVERLAPS = ("none", "tbo")

# SMs DeepEP's normal (prefill) dispatch and combine kernels hold while compute runs: 24 of an
# H800's 132 in DeepSeek's V3 prefill profile (deepseek-ai/profile-data README, its prefill
# figure: 108 SMs compute, 24 communication; DeepEP's README sets `Buffer.set_num_sms(24)`)
COMM_SMS = 24


@dataclass(frozen=True)
class Execution:
    overlap: str = "none"
    placement: str = "eplb"
    streamed_experts: float = 0.0

    def __post_init__(self) -> None:
        if self.overlap not in OVERLAPS:
            raise ValueError(f"Execution.overlap must be one of {OVERLAPS}, got {self.overlap!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"Execution.placement must be one of {PLACEMENTS}, got {self.placement!r}"
            )
        if not 0.0 <= self.streamed_experts <= 1.0:
            raise ValueError(
                f"Execution.streamed_experts must be in [0, 1], got {self.streamed_experts}"
            )


DEFAULT_EXECUTION = Execution()  # frozen: one shared default


def overlapped(compute_s: float, exchange_s: float, num_sms: int) -> tuple[float, float]:
    """(compute's time, the exchange's exposed time) of a stage's layers under two-batch
    overlap (module docstring): compute on the SMs the exchange leaves it, and the part of the
    exchange longer than that."""
    slowed = compute_s * num_sms / (num_sms - COMM_SMS)
    return slowed, max(0.0, exchange_s - slowed)
