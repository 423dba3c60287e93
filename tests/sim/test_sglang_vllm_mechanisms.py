"""SGLang's and vLLM's mechanisms in `sglang-pp` and `vllm-pp` (sim/loops/sglang.py,
sim/loops/vllm_pp.py), each on a small analytic case.

Compute is a constant T per microbatch on every rank, host costs are zero unless a case sets
them, blocks are 16 tokens.
"""

from types import SimpleNamespace

import pytest

from wavepp.sched import PlannerConfig
from wavepp.sched.cost_model import CostCoefficients, CostModel
from wavepp.sched.request import Request
from wavepp.sim import SimCosts, build_sim, run_closed_loop
from wavepp.sim.cost.hardware import get_hardware
from wavepp.sim.cost.model_catalog import get_model
from wavepp.sim.loops.loop_costs import LoopCosts
from wavepp.sim.loops.sglang import (
    SGLANG_LEGACY,
    SGLANG_V0518,
    SglangMechanisms,
    SglangScheduling,
    get_sglang,
    sglang_planner,
)
from wavepp.sim.loops.vllm_pp import VLLM_LEGACY, VLLM_V0280, VllmMechanisms, get_vllm
from wavepp.sim.studies.scenario import SimSetup, build_system

BS, T = 16, 1e-3


def no_host(**changes) -> LoopCosts:
    base = dict(
        fetch_s=0.0,
        schedule_s=0.0,
        schedule_item_s=0.0,
        match_block_s=0.0,
        alloc_block_s=0.0,
        relay_s=0.0,
        hop_s=0.0,
        finalize_s=0.0,
        block_tokens=BS,
    )
    return LoopCosts(**{**base, **changes})


def sglang_sim(
    mech: SglangMechanisms,
    *,
    stages: int = 2,
    budget: int = 4 * BS,
    host: LoopCosts | None = None,
    coef: CostCoefficients | None = None,
):
    """`sglang-pp` on `stages` ranks as build_system wires it: the PrefillAdder's planner and the
    mechanisms' hooks."""
    host = host or no_host()
    pcfg = PlannerConfig(block_size=BS, num_stages=stages, static_wave_tokens=budget)
    planner = sglang_planner(
        mech, pcfg, CostModel(coef or CostCoefficients(c_wave=0.0, c0=0.0, g=0.0, b=1.0, a=0.0))
    )
    hooks = SglangScheduling(mech, planner, BS, host.block_tokens, host.match_block_s)
    return build_sim(
        "sglang-pp",
        stages,
        SimCosts(wave_seconds=lambda stage, chunks: T),
        stage_num_blocks=512,
        block_size=BS,
        planner_config=pcfg,
        max_waves_in_flight=stages,
        check_integrity=True,
        loop="sglang",
        loop_costs=host,
        planner=planner,
        sglang=hooks,
    )


def request(request_id: int, num_blocks: int, fill: int = 0) -> Request:
    return Request.create(request_id, [fill or 1000 + request_id] * (num_blocks * BS), BS)


# ---- dynamic_chunking ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dynamic, chunks",
    [
        (False, [64, 64, 64]),
        # f(l) = l^2: after L tokens the chunk x solves x^2 + 2Lx = 64^2, smoothed 0.75 toward 64,
        # floored at 16 (64 / 4) and to the block: L = 64 -> 26.5 -> 35.9 -> 32; after that 16
        (True, [64, 32, 16, 16, 16, 16, 16, 16]),
    ],
)
def test_dynamic_chunking_shrinks_the_chunks_after_the_first(dynamic, chunks):
    """A 12-block prompt under a 4-block chunked_prefill_size: without dynamic chunking every
    chunk is the budget; with it each chunk costs (by the fitted quadratic) what the first did."""
    mech = SGLANG_V0518.with_changes(dynamic_chunking=dynamic)
    sim = sglang_sim(mech, coef=CostCoefficients(c_wave=0.0, c0=0.0, g=0.0, b=0.0, a=1.0))
    report = run_closed_loop(sim, [[5] * (12 * BS)], 1)
    assert report.num_failed == 0
    assert [c.num_tokens for w in sim.waves_sent for c in w.chunks] == chunks


# ---- admit_on_schedule -----------------------------------------------------------------------


def test_prefill_adder_takes_the_waiting_requests_that_fit_what_is_left():
    """Budget 4 blocks; the running request's last block goes first (3 left); a waiting request
    with 2 of 3 blocks cached is charged its 1 new block (2 left); a cold 4-block request is cut
    to the 2 blocks left (0 left): two requests taken, the third waits. Off: all (None)."""
    running = request(0, 4)
    running.num_scheduled_tokens = 3 * BS
    warm, cold, later = request(1, 3, fill=7), request(2, 4), request(3, 4)
    cached = {1: 2 * BS, 2: 0, 3: 0}
    leader = SimpleNamespace(plannable=[running], waiting=[warm, cold, later])
    planner = sglang_planner(
        SGLANG_V0518,
        PlannerConfig(block_size=BS, num_stages=2, static_wave_tokens=4 * BS),
        CostModel(),
    )
    hooks = SglangScheduling(SGLANG_V0518, planner, BS, BS, 0.0)
    assert hooks.round_size(leader, lambda r: cached[r.request_id]) == 2
    eager = SglangScheduling(SGLANG_LEGACY, planner, BS, BS, 0.0)
    assert eager.round_size(leader, lambda r: cached[r.request_id]) is None


@pytest.mark.parametrize("admit_on_schedule, admitted", [(True, 2), (False, 8)])
def test_admission_on_schedule_keeps_the_rest_waiting(admit_on_schedule, admitted):
    """Eight cold 2-block prompts under a 4-block budget: the first batch admits the two that
    fit it, against all eight when admission is eager."""
    mech = SGLANG_V0518.with_changes(admit_on_schedule=admit_on_schedule)
    sim = sglang_sim(mech)
    for i in range(8):
        sim.submit(i, [100 + i] * (2 * BS))
    sim._schedule()
    assert len(sim.leader.plannable) == admitted
    assert [c.request_id for c in sim.waves_sent[0].chunks] == [0, 1]


# ---- match_scope -----------------------------------------------------------------------------


def test_a_pass_walks_what_it_takes_and_where_it_stops():
    """Walks of 1 us per block: taking the first of [3 of 4 blocks cached, cold, cold] walks
    it (3 matched + the miss) and the next (its miss): 5 blocks; taking all walks 6; "admitted":
    no pass walks."""
    waiting = [request(1, 4, fill=7), request(2, 4), request(3, 4)]
    leader = SimpleNamespace(plannable=[], waiting=waiting)
    cached = {1: 3 * BS, 2: 0, 3: 0}
    planner = sglang_planner(
        SGLANG_V0518,
        PlannerConfig(block_size=BS, num_stages=2, static_wave_tokens=4 * BS),
        CostModel(),
    )
    hooks = SglangScheduling(SGLANG_V0518, planner, BS, BS, 1e-6)
    assert hooks.considered_match_s(leader, 1, lambda r: cached[r.request_id]) == pytest.approx(
        5e-6
    )
    assert hooks.considered_match_s(leader, None, lambda r: cached[r.request_id]) == pytest.approx(
        6e-6
    )
    admitted = SglangScheduling(
        SGLANG_V0518.with_changes(match_scope="admitted"), planner, BS, BS, 1e-6
    )
    assert admitted.considered_match_s(leader, 1, lambda r: cached[r.request_id]) == 0.0


def test_a_walk_counts_blocks_of_real_tokens():
    """At 16 real tokens per simulated one, 64 matched simulated tokens are 1,024 real: 32 blocks
    of 32 tokens matched and the miss; a walk never counts past the prompt's last block."""
    planner = sglang_planner(
        SGLANG_V0518,
        PlannerConfig(block_size=BS, num_stages=2, static_wave_tokens=4 * BS),
        CostModel(),
    )
    hooks = SglangScheduling(SGLANG_V0518, planner, BS, 32, 1e-6, token_scale=16)
    assert hooks.walk_s(64, 128) == pytest.approx(33e-6)
    assert hooks.walk_s(128, 128) == pytest.approx(64e-6)


def test_the_walks_delay_the_first_launch_on_every_rank():
    """Two cold 4-block prompts, 4-block budget, walks of 1 s per block: the first pass walks
    both (one block each, 2 s) before rank 0 launches, and rank 1 walks again before it runs:
    the first microbatch leaves rank 1 after 4 s and T of compute. Scope "admitted" walks
    nothing for cold prompts."""
    host = no_host(match_block_s=1.0)
    spans = {}
    for scope in ("considered", "admitted"):
        sim = sglang_sim(SGLANG_V0518.with_changes(match_scope=scope), host=host)
        run_closed_loop(sim, [[100] * (4 * BS), [200] * (4 * BS)], 2)
        spans[scope] = sorted(end for rank, _, _, end in sim.wave_spans if rank == 1)[0]
    assert spans["considered"] == pytest.approx(4.0 + T)
    assert spans["admitted"] == pytest.approx(2 * T)


# ---- presets and vLLM's budget ---------------------------------------------------------------


def test_presets_and_validation():
    assert get_sglang("legacy") == SglangMechanisms()
    assert (
        SGLANG_LEGACY.dynamic_chunking,
        SGLANG_LEGACY.admit_on_schedule,
        SGLANG_LEGACY.match_scope,
    ) == (True, False, "admitted")
    assert (
        SGLANG_V0518.dynamic_chunking,
        SGLANG_V0518.admit_on_schedule,
        SGLANG_V0518.match_scope,
        SGLANG_V0518.min_free_memory,
    ) == (False, True, "considered", True)
    assert not SGLANG_LEGACY.min_free_memory
    assert get_sglang("v0.5.18-dynamic").dynamic_chunking
    assert get_vllm("legacy") == VllmMechanisms(8192) and get_vllm("v0.28.0") == VllmMechanisms(
        16384
    )
    with pytest.raises(ValueError, match="match_scope"):
        SglangMechanisms(match_scope="every")
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        VllmMechanisms(0)
    with pytest.raises(ValueError, match="unknown sglang preset"):
        get_sglang("v0.4")


@pytest.mark.parametrize("model", ["glm-5", "minimax-m2"])
def test_pools_hold_the_smallest_free_memory_of_the_ranks(model):
    """v0.5.18 sizes every rank's pool from the free memory after the weights, MIN over the
    ranks, over the rank's own layers' bytes per token; the legacy preset keeps each rank's own."""
    from wavepp.sim.cost.stages import partition_layers, stage_kv_tokens

    m, hw = get_model(model), get_hardware("B300")
    own = SimSetup(m, hw, 4, token_scale=64, sglang=SGLANG_LEGACY)
    shared = SimSetup(m, hw, 4, token_scale=64, sglang=SGLANG_V0518)
    bounds = partition_layers(m, hw, 4)
    tokens = [
        stage_kv_tokens(m, hw, a, b, first=i == 0, last=i == 3) for i, (a, b) in enumerate(bounds)
    ]
    per_token = [sum(m.kv_bytes_per_token(j) for j in range(a, b)) for a, b in bounds]
    free = min(t * p for t, p in zip(tokens, per_token))
    pools = {
        name: [srv.pool.num_blocks for srv in build_system("sglang-pp", setup).servers]
        for name, setup in (("own", own), ("shared", shared))
    }
    assert pools["own"] == [t // (16 * 64) for t in tokens]
    assert pools["shared"] == [int(free / p) // (16 * 64) for p in per_token]
    assert (
        all(a <= b for a, b in zip(pools["shared"], pools["own"]))
        and pools["shared"] != pools["own"]
    )


@pytest.mark.parametrize("vllm, tokens", [(VLLM_LEGACY, 8192), (VLLM_V0280, 16384)])
def test_vllm_budget_is_max_num_batched_tokens(vllm, tokens):
    """vllm-pp's batches are max_num_batched_tokens (at the setup's token scale)."""
    setup = SimSetup(get_model("glm-5"), get_hardware("B300"), 4, token_scale=64, vllm=vllm)
    sim = build_system("vllm-pp", setup)
    assert sim.leader.planner.config.static_wave_tokens == tokens // 64
