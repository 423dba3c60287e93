"""A CPU "hardware" for the simulator, fitted from measured stage times of the real runtime.

The real runtime reports, per wave and stage, the chunk shapes it ran and the seconds its
compute took. Fitting t(L, x) = c0 + g*L + b*x + a*(2*L*x + x^2) (plus c_wave per wave) per
stage to those samples gives the simulator the machine's own costs, so it can predict the
runtime's throughput on workloads it has not run:

    samples = [StageSample(stage_id, ((num_cached, num_new), ...), seconds), ...]
    cpu = CpuHardware.fit(samples, admission=CPU_ADMISSION)
    sim = cpu.build("wavepp", stage_num_blocks=1024, block_size=16)
    result = run_closed_loop(sim, prompts, concurrency)

The outside loops (trtllm-pp, sglang-pp) also need their host cost per iteration on this
machine: `loop_costs_from_rounds` takes it from the runtime's own per-iteration exchanges
under that policy (its round spans), and `cpu.build("trtllm-pp", loop_costs=...)` uses it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from wavepp.cache.host_tier import HostTier
from wavepp.cache.store_tier import StoreTier
from wavepp.sched.cost_model import CostCoefficients, CostModel
from wavepp.sched.planners import PlannerConfig
from wavepp.sched.policy import loop_planner_args
from wavepp.sim.core.pipeline import PipelineSim, SimCosts
from wavepp.sim.core.shared_store import SimSharedStore
from wavepp.sim.harness import build_sim
from wavepp.sim.loops.loop_costs import LoopCosts
from wavepp.sim.studies.sim_setup import AdmissionCosts
from wavepp.sim.studies.systems import get_system

# Admission on this project's development machine (2-core VM): BlockPool lease 0.66 us per
# pinned block and reserve + commit 4.9 us per new block (16-token blocks), timed directly.
# Message latency and per-message work over gloo are assumptions: measure them on the target.
CPU_ADMISSION = AdmissionCosts(
    round_latency_s=150e-6,
    msg_s=100e-6,
    item_s=20e-6,
    leased_block_s=0.66e-6,
    new_block_s=4.9e-6,
    leader_item_s=10e-6,
    block_tokens=16,
)


@dataclass(frozen=True)
class StageSample:
    """One measured wave on one stage: its chunks as (num_cached, num_new) and its seconds."""

    stage_id: int
    chunks: tuple[tuple[int, int], ...]
    seconds: float

    def __post_init__(self) -> None:
        if self.stage_id < 0:
            raise ValueError(f"StageSample.stage_id must be >= 0, got {self.stage_id}")
        if self.seconds < 0:
            raise ValueError(f"StageSample.seconds must be >= 0, got {self.seconds}")
        if not self.chunks:
            raise ValueError("StageSample.chunks is empty")


def fit_stage_costs(
    samples: Iterable[StageSample], num_stages: int | None = None
) -> tuple[CostCoefficients, ...]:
    """Least-squares coefficients per stage (the planner's own fit, with a negligible prior)."""
    samples = list(samples)
    n = num_stages or (max(s.stage_id for s in samples) + 1 if samples else 0)
    models = [CostModel(prior_weight=1e-6) for _ in range(n)]
    for s in samples:
        if s.stage_id >= n:
            raise ValueError(f"sample of stage {s.stage_id}, but only {n} stages")
        models[s.stage_id].observe(s.chunks, s.seconds)
    empty = [i for i, m in enumerate(models) if m.num_observations == 0]
    if empty:
        raise ValueError(f"no samples for stage(s) {empty}")
    return tuple(m.coef for m in models)


@dataclass(frozen=True)
class CpuHardware:
    """Per-stage wave costs (fitted or given) and the links and admission costs between them."""

    stage_costs: tuple[CostCoefficients, ...]
    transfer_latency_s: float = 0.0  # activations, stage to stage
    transfer_s_per_token: float = 0.0
    result_latency_s: float = 0.0  # last stage back to rank 0
    admission: AdmissionCosts = field(default_factory=lambda: CPU_ADMISSION)
    # a stage's copies to and from its host KV tier (build(host_kv_bytes=...)), bytes/s
    host_link_bytes_s: float = 0.0
    # a stage's fetches from a shared KV store (build(store=...)): bytes/s and a fixed cost
    store_link_bytes_s: float = 0.0
    store_fetch_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.stage_costs:
            raise ValueError("CpuHardware.stage_costs is empty")
        for name in (
            "transfer_latency_s",
            "transfer_s_per_token",
            "result_latency_s",
            "host_link_bytes_s",
            "store_link_bytes_s",
            "store_fetch_latency_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"CpuHardware.{name} must be >= 0")

    @classmethod
    def fit(
        cls, samples: Iterable[StageSample], *, num_stages: int | None = None, **kwargs
    ) -> "CpuHardware":
        return cls(fit_stage_costs(samples, num_stages), **kwargs)

    @property
    def num_stages(self) -> int:
        return len(self.stage_costs)

    def sim_costs(self, block_size: int = 16) -> SimCosts:
        models = [CostModel(c) for c in self.stage_costs]
        adm = self.admission
        blocks = block_size / adm.block_tokens

        def wave_seconds(stage_id: int, chunks: Sequence[tuple[int, int]]) -> float:
            return models[stage_id].wave_time(chunks)

        return SimCosts(
            wave_seconds=wave_seconds,
            transfer_seconds=lambda stage_id, n: (
                self.transfer_latency_s + self.transfer_s_per_token * n
            ),
            result_seconds=self.result_latency_s,
            host_link_bytes_s=self.host_link_bytes_s,
            store_link_bytes_s=self.store_link_bytes_s,
            store_fetch_latency_s=self.store_fetch_latency_s,
            round_latency_s=adm.round_latency_s,
            round_msg_s=adm.msg_s,
            round_item_s=adm.item_s,
            round_leased_block_s=adm.leased_block_s * blocks,
            round_new_block_s=adm.new_block_s * blocks,
            leader_item_s=adm.leader_item_s,
        )

    def build(
        self,
        policy: str,
        *,
        stage_num_blocks: Sequence[int] | int = 1024,
        block_size: int = 16,
        planner_config: PlannerConfig | None = None,
        check_integrity: bool = False,
        loop_costs: LoopCosts | None = None,
        host_kv_bytes: int = 0,
        store: SimSharedStore | None = None,
        stage_block_bytes: Sequence[int] = (),
    ) -> PipelineSim:
        """The runtime's pipeline on this machine under `policy` (wavepp, lockstep, static, ...).
        The balanced planner starts from the slowest stage's fitted costs, as the runtime's
        would after its first waves. The outside loops (trtllm-pp, sglang-pp) run their
        framework's loop (sim/loops/loop_sim.py) with the runtime's budgets and `loop_costs` (this
        machine's host costs per iteration, `loop_costs_from_rounds`); sglang-pp's dynamic
        chunking keeps the runtime planner's default cost model, as the runtime does.
        `host_kv_bytes`: a host KV tier of that many bytes a stage, its copies at
        `host_link_bytes_s`; `store`: a KV store the stages share with other pipelines'
        (sim/core/shared_store.py), fetched at `store_link_bytes_s`. Either tier needs each
        stage's bytes of a block, `stage_block_bytes`."""
        spec = get_system(policy)
        if spec.topology == "tp":
            raise ValueError(f"{spec.name} needs a device cost model, not a fitted CPU pipeline")
        store_tiers = host_tiers = None
        if (store is not None or host_kv_bytes) and (
            len(stage_block_bytes) != self.num_stages or min(stage_block_bytes) <= 0
        ):
            raise ValueError(
                f"a tier needs each of the {self.num_stages} stages' block bytes (> 0), "
                f"got {list(stage_block_bytes)}"
            )
        if host_kv_bytes:
            if not self.host_link_bytes_s:
                raise ValueError("a host tier needs CpuHardware.host_link_bytes_s > 0")
            host_tiers = [HostTier(host_kv_bytes, n) for n in stage_block_bytes]
        if store is not None:
            store_tiers = [
                StoreTier(f"cpu/b{block_size}/stage{i}", n, store.link(n))
                for i, n in enumerate(stage_block_bytes)
            ]
        slowest = max(self.stage_costs, key=lambda c: CostModel(c).wave_time([(1024, 256)]))
        pcfg = planner_config or PlannerConfig(
            block_size=block_size, num_stages=self.num_stages, **loop_planner_args(spec.loop)
        )
        cost_model = None if spec.loop == "sglang" else CostModel(slowest)
        return build_sim(
            spec.policy,
            self.num_stages,
            self.sim_costs(block_size),
            stage_num_blocks=stage_num_blocks,
            block_size=block_size,
            planner_config=pcfg,
            cost_model=cost_model,
            max_waves_in_flight=spec.ring_per_stage * self.num_stages,
            check_integrity=check_integrity,
            central_pool=spec.topology == "central",
            loop=spec.loop,
            loop_costs=loop_costs or LoopCosts(block_tokens=block_size),
            host_tiers=host_tiers,
            store_tiers=store_tiers,
        )


def link_latency_s(wave_spans: Iterable[Sequence]) -> float:
    """The hop between two stages, from the runtime's wave spans (stage, wave id, start, end)
    of one run: the median, over the waves that found stage 1 idle (its wave before had ended
    by the time stage 0 finished this one), of stage 0's end to stage 1's start. A wave that
    queued behind stage 1's last one would count the queue as link; 0 when no wave found it
    idle."""
    spans = list(wave_spans)
    ends = {w: end for stage, w, _, end in spans if stage == 0}
    s1 = sorted((w, start, end) for stage, w, start, end in spans if stage == 1)
    hops = [
        start - ends[w]
        for (_, _, before_end), (w, start, _) in zip(s1, s1[1:])
        if w in ends and before_end <= ends[w]
    ]
    return max(0.0, statistics.median(hops)) if hops else 0.0


def loop_costs_from_rounds(round_spans: Iterable[tuple[int, float, float]]) -> LoopCosts:
    """An outside loop's host costs on this machine, from the runtime's round spans under that
    policy: (round id, start, end) per iteration's exchange, round id -1 where nothing was
    admitted (the empty request list). Rank 0's exchange, the loop's fetch + schedule +
    every rank's match and allocation, costs `schedule_s` (the mean over every iteration:
    with and without admission, in the proportion the run had them); a message between
    ranks costs `hop_s`, half the median empty exchange (one message out, one back). The
    per-request and per-block costs are inside the measured exchange, so they are zero here."""
    spans = list(round_spans)
    if not spans:
        raise ValueError("no round spans: run the policy on the runtime first")
    empty = sorted(end - start for rid, start, end in spans if rid == -1)
    hop_s = empty[len(empty) // 2] / 2 if empty else 0.0
    schedule_s = sum(end - start for _, start, end in spans) / len(spans)
    return LoopCosts(
        fetch_s=0.0,
        schedule_s=schedule_s,
        schedule_item_s=0.0,
        match_block_s=0.0,
        alloc_block_s=0.0,
        relay_s=0.0,
        hop_s=hop_s,
        finalize_s=0.0,
    )
