"""One simulated setting: a system on a model and hardware, running one workload.

Granularity: huge prompts would cost the simulator time per token (hashing, one Python int per
token), so a simulated token may stand for `token_scale` real ones. Prompts are generated at
the simulated scale, chunk boundaries fall on whole simulated tokens, and every cost is charged
on real tokens (shapes are multiplied back before the cost model sees them). Throughput is
reported in real tokens per second.
"""

from __future__ import annotations

from dataclasses import replace

from wavepp.sched.cost_model import (
    CostCoefficients,
    CostModel,
    efficient_wave_tokens,
    fit_coefficients,
    peak_wave_tokens,
    profile_wave_shapes,
)
from wavepp.sched.planners import MPU_PAPER_TOKENS, PlannerConfig
from wavepp.sched.planners.dynamic import fit_warmup, warmup_lengths
from wavepp.sim.core.pipeline import PipelineSim, SimCosts
from wavepp.sim.core.shared_store import SimSharedStore
from wavepp.sim.cost.stage_cost import StageCostModel, transfer_seconds
from wavepp.sim.cost.stages import (
    REFERENCE_WAVE,
    packed_waves,
    partition_layers,
    stage_models,
)
from wavepp.sim.harness import SimReport, build_sim, report, run_closed_loop
from wavepp.sim.loops.sglang import SglangScheduling, sglang_planner
from wavepp.sim.loops.trtllm import MicroBatchPlanner, TrtllmScheduling
from wavepp.sim.studies.sim_setup import SimResult, SimSetup
from wavepp.sim.studies.stage_memory import (
    host_tiers,
    model_interval_blocks,
    pool_blocks,
    store_tiers,
)
from wavepp.sim.studies.systems import BUDGETED, SystemSpec, get_system
from wavepp.workloads import Workload
from wavepp.workloads.workload import ideal_snapshot_hit_rate, reusable_tokens

PROFILE_MAX_TOKENS = 65536  # real tokens: the largest wave of the profiling pass


def build_system(
    system: str,
    setup: SimSetup,
    *,
    check_integrity: bool = False,
    store: SimSharedStore | None = None,
) -> PipelineSim:
    """The pipeline of `system` on `setup`'s model and hardware, ready to take requests: its
    stages' layers and cost models, their pools, the planner's budget, the outside loop's
    mechanisms where it runs one. `store`: a KV store its stages share with other pipelines'
    (run_replicas gives them one); without it, one of its own where `setup.kv_tier_gib` is
    set."""
    if store is None and setup.kv_tier_gib:
        store = shared_store(setup)
    spec = get_system(system)
    m, bs = setup.model, setup.block_size
    bounds, degree, stages = _stage_layout(spec, setup)
    trt = setup.trtllm if spec.loop == "trtllm" else None
    if trt is not None and setup.budget_tokens:
        trt = replace(trt, max_num_tokens=setup.budget_tokens)
    sg = setup.sglang if spec.loop == "sglang" else None
    interval = model_interval_blocks(setup) if m.hybrid else None
    blocks = pool_blocks(spec, setup, bounds, degree, interval)
    if trt is not None and trt.min_rank_pools:  # max_tokens allreduced with MIN over the ranks
        blocks = [min(blocks)] * len(blocks)
    costs = scaled_costs(stages, setup, local=spec.topology != "pp", lease_escrow=spec.lease_escrow)
    prior, chunk, pcfg = _planning(spec, setup, stages)
    loop_costs = setup.loop_costs.scaled(setup.token_scale)
    planner, hooks = _loop_scheduling(setup, trt, sg, pcfg, chunk, prior, loop_costs)
    return build_sim(
        spec.policy,
        len(stages),
        costs,
        stage_num_blocks=blocks,
        block_size=bs,
        host_tiers=host_tiers(spec, setup, bounds, degree),
        store_tiers=store_tiers(spec, setup, bounds, degree, store),
        planner_config=pcfg,
        cost_model=CostModel(prior),
        max_waves_in_flight=spec.ring_per_stage * len(stages),
        max_round_requests=setup.max_round_requests,
        check_integrity=check_integrity,
        hybrid=m.hybrid,
        central_pool=spec.topology == "central",
        snapshot_interval_blocks=interval,
        loop=spec.loop,
        loop_costs=loop_costs,
        planner=planner,
        trtllm=hooks if trt is not None else None,
        sglang=hooks if sg is not None else None,
        serial_chunks=None if trt is None else not trt.overlap_chunks,
    )


def shared_store(setup: SimSetup) -> SimSharedStore:
    """An empty KV store of `setup.kv_tier_gib`, for every replica's stages to share."""
    return SimSharedStore(int(setup.kv_tier_gib * 2**30))


def fixed_budget(spec: SystemSpec, setup: SimSetup) -> int | None:
    """The real tokens of `spec`'s fixed (or base) budget on `setup`, None for a cost-sized one:
    `setup.budget_tokens` where set (sim/studies/systems.py BUDGETED), else the system's default;
    per device under dp-ep."""
    if setup.budget_tokens and spec.name in BUDGETED:
        tokens = setup.budget_tokens
    elif spec.loop == "trtllm":
        tokens = setup.trtllm.max_num_tokens
    elif spec.loop == "sglang":
        tokens = setup.sglang.chunked_prefill_size
    elif spec.name == "vllm-pp":
        tokens = setup.vllm.max_num_batched_tokens
    else:
        tokens = spec.chunk_tokens
    if tokens and spec.layout == "dp":
        tokens *= setup.num_devices
    return tokens


def scaled_costs(
    stages: list[StageCostModel], setup: SimSetup, *, local: bool, lease_escrow: bool = True
) -> SimCosts:
    """SimCosts in simulated tokens over cost models in real tokens. `local`: admission runs
    in the scheduler's own process (one pool), no rounds-plane latency. `lease_escrow=False`
    charges nothing for pinning and reserving blocks (the ablation's wave admission alone)."""
    s, m, hw, adm = setup.token_scale, setup.model, setup.hardware, setup.admission
    runtime_blocks = setup.block_size * s / adm.block_tokens  # runtime blocks per simulated block

    def wave_seconds(stage_id, chunks):
        return stages[stage_id].wave_seconds([(L * s, x * s) for L, x in chunks])

    last = len(stages) - 1
    return SimCosts(
        wave_seconds=wave_seconds,
        transfer_seconds=lambda stage_id, num_tokens: transfer_seconds(
            m, hw, num_tokens * s, internode=setup.crosses_nodes(stage_id)
        ),
        result_seconds=hw.internode_latency_s
        if setup.crosses_nodes(last) and last
        else hw.link_latency_s,
        host_link_bytes_s=hw.host_link_bytes_s,
        store_link_bytes_s=setup.store_link_bytes_s,
        store_fetch_latency_s=setup.store_fetch_latency_s,
        round_latency_s=0.0 if local else adm.round_latency_s,
        round_msg_s=adm.msg_s,
        round_item_s=adm.item_s,
        round_leased_block_s=adm.leased_block_s * runtime_blocks * lease_escrow,
        round_new_block_s=adm.new_block_s * runtime_blocks * lease_escrow,
        leader_item_s=adm.leader_item_s,
    )


def fit_prior(stages: list[StageCostModel], setup: SimSetup) -> CostCoefficients:
    """The planners' starting cost model, in simulated tokens: the profiling pass a deployment
    runs before serving (`profile_wave_shapes`: waves of one and four chunks, a block to the
    largest wave, after short and long prefixes), timed on the slowest stage and fitted with its
    knee (`fit_coefficients`). The planner keeps refining it online."""
    return fit_coefficients(profile_samples(stages, setup))


def profile_samples(stages: list[StageCostModel], setup: SimSetup) -> list:
    """The profiling pass: (chunks, seconds on the slowest stage) per shape, simulated tokens."""
    s = setup.token_scale
    shapes = profile_wave_shapes(PROFILE_MAX_TOKENS // s, setup.block_size)
    return [
        (chunks, max(st.wave_seconds([(L * s, x * s) for L, x in chunks]) for st in stages))
        for chunks in shapes
    ]


def sglang_warmup_fit(stage: StageCostModel, setup: SimSetup, base_tokens: int) -> CostCoefficients:
    """SGLang's dynamic chunking fit, in simulated tokens: its warm-up prefills (`warmup_lengths`
    of the base chunk, `base_tokens` real) timed on the first stage alone, as SGLang times them
    on PP0, and fitted as SGLang fits them (`fit_warmup`)."""
    s = setup.token_scale
    lengths = warmup_lengths(base_tokens)
    fit = fit_warmup(lengths, [stage.wave_seconds([(0, n)]) for n in lengths])  # real tokens
    return CostCoefficients(c_wave=0.0, c0=fit.c0, g=0.0, b=fit.b * s, a=fit.a * s * s)


def run_setting(
    system: str,
    setup: SimSetup,
    workload: Workload,
    concurrency: int,
    *,
    check_integrity: bool = False,
) -> tuple[SimResult, PipelineSim]:
    """Run `workload` (prompts at the simulated scale) through `system`: closed loop with
    `concurrency` outstanding requests, or open loop at its arrival times if it has them."""
    setup = balanced_on(setup, workload)
    sim = build_system(system, setup, check_integrity=check_integrity)
    rep = drive(sim, workload, concurrency)
    tiers = [sv.pool.host_tier for sv in sim.servers if sv.pool.host_tier is not None]
    stores = [sv.tiers.store for sv in sim.servers if sv.tiers.store is not None]
    result = replace(
        to_result(rep, system, setup, workload, concurrency),
        host_offloaded_blocks=sum(t.num_offloaded for t in tiers),
        host_loaded_blocks=sum(t.num_loaded for t in tiers),
        store_loaded_blocks=sum(t.num_loaded_blocks for t in stores),
    )
    return result, sim


def balanced_on(setup: SimSetup, workload: Workload, max_prompts: int = 64) -> SimSetup:
    """`setup` with its layers balanced on `workload` (unless it names waves of its own): the
    waves its first `max_prompts` prompts run as, each prompt's ideally reused prefix skipped,
    packed into waves of the balanced planner's M (or REFERENCE_WAVE's tokens). In real
    tokens."""
    if setup.balance_waves or not workload.prompts:
        return setup
    prompts = workload.prompts[:max_prompts]
    scale = setup.token_scale
    reused = reusable_tokens(prompts, setup.block_size)
    shapes = [(len(p) * scale, min(len(p) - 1, r) * scale) for p, r in zip(prompts, reused)]
    wave_tokens = setup.max_wave_tokens or sum(n for _, n in REFERENCE_WAVE[0])
    return replace(setup, balance_waves=packed_waves(shapes, wave_tokens))


def drive(sim: PipelineSim, workload: Workload, concurrency: int) -> SimReport:
    if concurrency <= 0:
        raise ValueError(f"concurrency must be positive, got {concurrency}")
    if workload.arrival_times_s is not None:
        for i, (t, prompt) in enumerate(zip(workload.arrival_times_s, workload.prompts)):
            sim.submit(i, prompt, at=t)
        return report(sim, "", sim.run())
    return run_closed_loop(sim, workload.prompts, concurrency)


def to_result(
    rep: SimReport, system: str, setup: SimSetup, workload: Workload, concurrency: int
) -> SimResult:
    n = len(rep.stage_utilization) or 1
    return SimResult(
        system=system,
        model=setup.model.name,
        hardware=setup.hardware.name,
        num_devices=setup.num_devices,
        workload=workload.name,
        concurrency=concurrency,
        num_requests=rep.num_requests,
        num_failed=rep.num_failed,
        input_tok_s=rep.input_tok_s * setup.token_scale,
        seconds=rep.seconds,
        hit_rate=rep.hit_rate,
        ideal_hit_rate=workload.ideal_hit_rate,
        ttft_p50_s=rep.ttft_p50_s,
        ttft_p95_s=rep.ttft_p95_s,
        ttft_p99_s=rep.ttft_p99_s,
        stage_utilization=sum(rep.stage_utilization) / n,
        idle_admission_frac=sum(rep.idle_admission_frac) / n,
        num_waves=rep.num_waves,
        round_latency_p50_s=rep.round_latency_p50_s,
        ideal_hit_rate_on_grid=ideal_snapshot_hit_rate(
            workload.prompts, setup.block_size, model_interval_blocks(setup)
        )
        if setup.model.hybrid
        else None,
    )


def _aligned(real_tokens: int, setup: SimSetup) -> int:
    bs = setup.block_size
    return max(bs, setup.sim_tokens(real_tokens) // bs * bs)


def _stage_layout(
    spec: SystemSpec, setup: SimSetup
) -> tuple[list[tuple[int, int]], int, list[StageCostModel]]:
    """(layers [start, end) per stage, devices per stage, the stages' cost models): one stage of
    every layer over all the devices for a "tp" topology, else `setup.layer_split` (auto: the
    balanced split; even: by count), one device a stage."""
    m, hw = setup.model, setup.hardware
    if spec.topology == "tp":
        bounds, degree = [(0, m.num_layers)], setup.num_devices
    else:
        waves = setup.balance_waves or REFERENCE_WAVE
        bounds, degree = partition_layers(m, hw, setup.num_devices, setup.layer_split, waves), 1
    stages = stage_models(
        m,
        hw,
        bounds,
        degree=degree,
        overheads=setup.overheads,
        num_nodes=setup.num_nodes if spec.topology == "tp" else 1,
        layout=spec.layout,
        execution=spec.execution,
    )
    return bounds, degree, stages


def _planning(
    spec: SystemSpec, setup: SimSetup, stages: list[StageCostModel]
) -> tuple[CostCoefficients, int, PlannerConfig]:
    """(the planner's cost prior, the chunk budget in simulated tokens, the PlannerConfig): the
    prior fitted on the profiling pass (SGLang's dynamic chunking: on its own warm-up), the
    largest wave the profile finds efficient unless `setup.max_wave_tokens` sets it, the
    system's fixed budget where it has one."""
    s, bs = setup.token_scale, setup.block_size
    samples = profile_samples(stages, setup)
    prior = fit_coefficients(samples)
    largest = (
        _aligned(setup.max_wave_tokens, setup)
        if setup.max_wave_tokens
        else min(
            efficient_wave_tokens(prior, PROFILE_MAX_TOKENS // s, bs), peak_wave_tokens(samples)
        )
    )
    if spec.policy.planner == "dynamic":  # SGLang's chunking fits its own warm-up, not ours
        prior = sglang_warmup_fit(stages[0], setup, setup.sglang.chunked_prefill_size)
    chunk_tokens = fixed_budget(spec, setup)
    chunk = _aligned(chunk_tokens, setup) if chunk_tokens else largest
    mpu = MPU_PAPER_TOKENS if spec.policy.planner == "mpu" and spec.chunk_tokens is None else None
    pcfg = PlannerConfig(
        block_size=bs,
        num_stages=len(stages),
        max_wave_tokens=max(largest, chunk),
        min_wave_tokens=min(_aligned(setup.min_wave_tokens, setup), largest),
        static_wave_tokens=chunk,
        max_chunks_per_wave=256,
        # dp-ep: a chunk runs on one device, a request gets at most one device's budget
        max_chunk_tokens=_aligned(chunk_tokens // setup.num_devices, setup)
        if spec.layout == "dp" and chunk_tokens
        else 0,
        mpu_microbatch_tokens=mpu and _aligned(mpu[0], setup),
        mpu_min_tokens=mpu and _aligned(mpu[1], setup),
        fill_waves=True,
    )
    return prior, chunk, pcfg


def _loop_scheduling(setup, trt, sg, pcfg, chunk, prior, loop_costs) -> tuple:
    """(planner, hooks) of an outside loop: TensorRT-LLM's micro-batch planner (unless it packs
    as the static planner) and its scheduling hooks; SGLang's PrefillAdder (dynamic chunking, or
    the same budget every batch) and its hooks; (None, None) for every other system."""
    s, bs = setup.token_scale, setup.block_size
    planner = hooks = None
    if trt is not None:
        hooks = TrtllmScheduling(trt, chunk, bs, loop_costs.block_tokens, token_scale=s)
        if trt.budget_charge != "static":
            planner = MicroBatchPlanner(pcfg, trt, chunk)
    if sg is not None:
        planner = sglang_planner(sg, pcfg, CostModel(prior))
        hooks = SglangScheduling(
            sg, planner, bs, setup.loop_costs.block_tokens, loop_costs.match_block_s, token_scale=s
        )
    return planner, hooks
