"""Build a simulated pipeline from a policy name and run workloads through it.

The deterministic harness of the leader's tests and the core of `wavepp simulate`: S stage
caches (each its own BlockPool), the real Leader and planner, virtual time. It sits above the
event core (core/) and the outside loops (loops/), which it chooses between, and below the
studies (studies/).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from wavepp.cache import BlockPool, HostTier, SnapshotPool
from wavepp.cache.store_tier import StoreTier
from wavepp.sched.cost_model import CostModel
from wavepp.sched.leader import Leader, LeaderConfig
from wavepp.sched.planners import PlannerConfig, make_planner
from wavepp.sched.policy import Policy, get_policy
from wavepp.sched.stage_server import StageServer
from wavepp.sched.stats import quantile
from wavepp.sim.core.pipeline import PipelineSim, SimCosts
from wavepp.sim.loops.loop_costs import LoopCosts
from wavepp.sim.loops.loop_sim import LoopSim


@dataclass(frozen=True)
class SimReport:
    policy: str
    num_requests: int
    num_failed: int
    seconds: float
    input_tokens: int
    cached_tokens: int
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    stage_utilization: tuple[float, ...]
    idle_admission_frac: tuple[float, ...]
    round_latency_p50_s: float
    round_latency_p99_s: float
    num_waves: int

    @property
    def input_tok_s(self) -> float:
        return self.input_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def computed_tokens(self) -> int:
        return self.input_tokens - self.cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0


def hybrid_num_slots(num_blocks: int, interval_blocks: int) -> int:
    """Snapshot slots of a hybrid stage pool of `num_blocks` blocks: one per snapshot interval
    of the pool's blocks, and 16 more for chunks in flight."""
    return num_blocks // interval_blocks + 16


def hybrid_pool_blocks(
    num_blocks: int, block_bytes: float, snapshot_bytes: float, interval_blocks: int
) -> int:
    """Blocks of a hybrid stage pool whose memory would hold `num_blocks` blocks alone: its
    snapshot slots (hybrid_num_slots, `snapshot_bytes` each) take their share of that memory."""
    if snapshot_bytes <= 0:
        return num_blocks
    memory = num_blocks * block_bytes

    def fits(n: int) -> bool:
        return n * block_bytes + hybrid_num_slots(n, interval_blocks) * snapshot_bytes <= memory

    # a slot per interval on average, then the slot count's floor settles the last blocks
    blocks = int((memory - 16 * snapshot_bytes) / (block_bytes + snapshot_bytes / interval_blocks))
    while blocks > 0 and not fits(blocks):
        blocks -= 1
    while fits(blocks + 1):
        blocks += 1
    if blocks < 1:
        raise ValueError(
            f"a hybrid stage's memory ({num_blocks} blocks of {block_bytes / 1e6:.1f} MB) does not "
            f"hold 17 snapshot slots of {snapshot_bytes / 1e6:.1f} MB"
        )
    return blocks


def build_sim(
    policy: str | Policy,
    num_stages: int,
    costs: SimCosts,
    *,
    stage_num_blocks: Sequence[int] | int = 1024,
    block_size: int = 16,
    planner_config: PlannerConfig | None = None,
    cost_model: CostModel | None = None,
    max_waves_in_flight: int | None = None,
    max_round_requests: int = 64,
    check_integrity: bool = False,
    hybrid: bool = False,
    central_pool: bool = False,
    snapshot_interval_blocks: int | None = None,
    loop: str | None = None,
    loop_costs=None,
    planner=None,
    serial_chunks: bool | None = None,
    trtllm=None,
    sglang=None,
    host_tiers: Sequence[HostTier] | None = None,
    store_tiers: Sequence[StoreTier] | None = None,
    scheduling_policy: str = "fcfs",
) -> PipelineSim:
    """S stages, each with its own pool of `stage_num_blocks` blocks; or, with `central_pool`,
    one scheduler-side pool (its size: the smallest entry) and S execution stages. With
    `loop` (trtllm | sglang), every rank runs that outside executor loop
    (sim/loops/loop_sim.py) with `loop_costs`, S microbatch slots. `planner`: instead of the
    policy's; `serial_chunks`: a request's next chunk waits for its chunk in flight (default:
    under the trtllm loop); `trtllm`, `sglang`: those frameworks' mechanisms in their loops
    (sim/loops/trtllm.py, sglang.py); `host_tiers`: one host KV tier per stage pool
    (cache/host_tier.py); `store_tiers`: one view per stage of a KV store other pipelines may
    share (cache/store_tier.py); `scheduling_policy`: "fcfs" or "priority" (sched/waiting.py)."""
    pol = policy if isinstance(policy, Policy) else get_policy(policy)
    if isinstance(stage_num_blocks, int):
        stage_num_blocks = [stage_num_blocks] * num_stages
    if central_pool:
        stage_num_blocks = [min(stage_num_blocks)]
    pools = _stage_pools(stage_num_blocks, block_size, host_tiers, hybrid, snapshot_interval_blocks)
    stores = list(store_tiers) if store_tiers is not None else [None] * len(pools)
    if len(stores) != len(pools):
        raise ValueError(f"build_sim: {len(stores)} store tiers for {len(pools)} pools")
    servers = [StageServer(s, pool, store) for s, (pool, store) in enumerate(zip(pools, stores))]
    pcfg = planner_config or PlannerConfig(block_size=block_size, num_stages=num_stages)
    if hybrid:  # chunk ends move onto the stages' snapshot grid
        pcfg = replace(pcfg, snapshot_interval_blocks=snapshot_interval_blocks)
    kwargs = (
        {"cost_model": cost_model} if pol.planner in ("balanced", "dynamic") and cost_model else {}
    )
    config = LeaderConfig(
        len(servers),
        block_size,
        max_waves_in_flight=max_waves_in_flight or 2 * num_stages,
        max_round_requests=max_round_requests,
        stage_num_blocks=tuple(stage_num_blocks),
        hybrid=hybrid,
        serial_chunks=loop == "trtllm" if serial_chunks is None else serial_chunks,
        scheduling_policy=scheduling_policy,
    )
    leader = Leader(config, planner or make_planner(pol.planner, pcfg, **kwargs))
    if loop is not None:
        return LoopSim(
            leader,
            servers,
            costs,
            loop=loop,
            loop_costs=loop_costs or LoopCosts(),
            check_integrity=check_integrity,
            trtllm=trtllm,
            sglang=sglang,
        )
    return PipelineSim(
        leader,
        servers,
        costs,
        inline_admission=pol.inline_admission,
        check_integrity=check_integrity,
        num_stages=num_stages,
    )


def run_closed_loop(
    sim: PipelineSim, prompts: Sequence[Sequence[int]], concurrency: int, policy: str = ""
) -> SimReport:
    """Keep `concurrency` requests outstanding until all `prompts` are done."""
    next_index = 0

    def submit_next(*_):
        nonlocal next_index
        if next_index < len(prompts):
            i = next_index
            next_index += 1
            sim.submit(i, prompts[i])

    sim.on_finish = submit_next
    for _ in range(min(concurrency, len(prompts))):
        submit_next()
    end = sim.run()
    return report(sim, policy, end)


def report(sim: PipelineSim, policy: str, end: float) -> SimReport:
    recs = list(sim.records.values())
    done = [r for r in recs if r.failure is None and r.finish is not None]
    ttft = sorted(r.finish - r.arrival for r in done) or [0.0]
    rounds = sorted(e - s for _, s, e in sim.round_spans) or [0.0]
    util = tuple(st.busy_s / end if end > 0 else 0.0 for st in sim.stats)
    adm = tuple(st.idle_admission_s / end if end > 0 else 0.0 for st in sim.stats)
    return SimReport(
        policy=policy,
        num_requests=len(recs),
        num_failed=len(recs) - len(done),
        seconds=end,
        input_tokens=sum(r.num_tokens for r in done),
        cached_tokens=sum(r.num_cached_tokens for r in done),
        ttft_p50_s=quantile(ttft, 0.5),
        ttft_p95_s=quantile(ttft, 0.95),
        ttft_p99_s=quantile(ttft, 0.99),
        stage_utilization=util,
        idle_admission_frac=adm,
        round_latency_p50_s=quantile(rounds, 0.5),
        round_latency_p99_s=quantile(rounds, 0.99),
        num_waves=sim.stats[0].num_waves,
    )


def _stage_pools(
    stage_num_blocks: Sequence[int],
    block_size: int,
    host_tiers: Sequence[HostTier] | None,
    hybrid: bool,
    snapshot_interval_blocks: int | None,
) -> list[BlockPool]:
    """One pool per entry of `stage_num_blocks`, each with its host tier if `host_tiers` gives
    one; for a hybrid model, SnapshotPools with real snapshots (slots, leases, escrow, in-flight
    sharing), as the runtime keeps them, on a grid of `snapshot_interval_blocks`."""
    tiers = list(host_tiers) if host_tiers is not None else [None] * len(stage_num_blocks)
    if len(tiers) != len(stage_num_blocks):
        raise ValueError(f"build_sim: {len(tiers)} host tiers for {len(stage_num_blocks)} pools")
    if not hybrid:
        return [BlockPool(n, block_size, host_tier=t) for n, t in zip(stage_num_blocks, tiers)]
    if not snapshot_interval_blocks:
        raise ValueError(
            "build_sim: a hybrid model needs snapshot_interval_blocks (its snapshot grid)"
        )
    return [
        SnapshotPool(
            n,
            block_size,
            num_slots=hybrid_num_slots(n, snapshot_interval_blocks),
            interval_blocks=snapshot_interval_blocks,
            host_tier=t,
        )
        for n, t in zip(stage_num_blocks, tiers)
    ]
