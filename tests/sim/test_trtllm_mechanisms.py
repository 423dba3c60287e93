"""TensorRT-LLM's mechanisms in `trtllm-pp` (sim/loops/trtllm.py), each on a small analytic case.

Compute is a constant T per microbatch on every rank, host costs are zero unless a case sets
them, blocks are 16 tokens.
"""

import pytest

from wavepp.sched import PlannerConfig
from wavepp.sim import SimCosts, build_sim, run_closed_loop
from wavepp.sim.loops.loop_costs import LoopCosts
from wavepp.sim.loops.trtllm import (
    TRTLLM_LEGACY,
    TRTLLM_RC26,
    MicroBatchPlanner,
    TrtllmMechanisms,
    TrtllmScheduling,
    budget_chunk,
    shifted_end,
)

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


def trtllm_sim(
    mech: TrtllmMechanisms,
    *,
    stages: int = 4,
    budget: int = 64,
    host: LoopCosts | None = None,
    blocks: int = 512,
):
    pcfg = PlannerConfig(block_size=BS, num_stages=stages, static_wave_tokens=budget)
    planner = MicroBatchPlanner(pcfg, mech, budget) if mech.budget_charge != "static" else None
    hooks = TrtllmScheduling(mech, budget, BS, BS)
    return build_sim(
        "trtllm-pp",
        stages,
        SimCosts(wave_seconds=lambda stage, chunks: T),
        stage_num_blocks=blocks,
        block_size=BS,
        planner_config=pcfg,
        max_waves_in_flight=stages,
        check_integrity=True,
        loop="trtllm",
        loop_costs=host or no_host(),
        planner=planner,
        trtllm=hooks,
        serial_chunks=not mech.overlap_chunks,
    )


def shared_prefix_prompts(
    n: int, prefix_blocks: int = 3, suffix_blocks: int = 1
) -> list[list[int]]:
    prefix = [7] * (prefix_blocks * BS)
    return [prefix + [1000 + i] * (suffix_blocks * BS) for i in range(n)]


def test_chunk_arithmetic_of_the_fcfs_scheduler():
    # cut to the capacity and floored to the unit only when cut
    assert budget_chunk(100, 1000, 16) == 100
    assert budget_chunk(100, 40, 16) == 32
    # a 28 + 4 block prompt charged 16 blocks: reuse moves the window, the prompt's end binds
    assert shifted_end(28 * BS, 16 * BS, 32 * BS, BS) == 32 * BS
    # a 28 + 40 block prompt: the window ends 16 blocks after the reuse
    assert shifted_end(28 * BS, 16 * BS, 68 * BS, BS) == 44 * BS


@pytest.mark.parametrize("charge, per_wave", [("prompt", 1), ("uncached", 4)])
def test_cached_tokens_charged_leave_one_request_per_microbatch(charge, per_wave):
    """Prompts of 3 cached + 1 new blocks under a 4-block budget: charged from position 0, each
    warm request takes the whole budget and computes one block alone; charged its new block,
    four share a microbatch."""
    mech = TRTLLM_LEGACY.with_changes(budget_charge=charge)
    sim = trtllm_sim(mech)
    report = run_closed_loop(sim, shared_prefix_prompts(33), 8)
    assert report.num_failed == 0
    warm = [
        w for w in [w.chunks for w in sim.waves_sent] if w and all(c.start == 3 * BS for c in w)
    ]
    assert warm and max(len(w) for w in warm) == per_wave
    assert all(c.num_tokens == BS for w in warm for c in w)


def steady_period(
    mech: TrtllmMechanisms, host: LoopCosts, stages: int = 4, n: int = 24, steady: bool = True
) -> float:
    """The spacing of rank 0's launches once the pipeline is full (their mean if not `steady`)."""
    sim = trtllm_sim(mech, stages=stages, host=host)
    report = run_closed_loop(sim, [[i + 1] * 64 for i in range(n)], 4 * stages)
    assert report.num_failed == 0
    starts = sorted(start for stage, _, start, _ in sim.wave_spans if stage == 0)
    gaps = [b - a for a, b in zip(starts, starts[1:])][n // 2 :]
    if steady:
        assert max(gaps) == pytest.approx(min(gaps), rel=1e-9)
    return sum(gaps) / len(gaps)


@pytest.mark.parametrize("probe_s", [2e-4, 5e-3])
def test_a_probe_on_the_executor_path_delays_each_launch_by_its_time(probe_s):
    """One new request per microbatch, each walked once on every rank before the launch: with
    the forward synchronized, the period grows by exactly the walk; off the executor path it
    costs nothing."""
    host = no_host(schedule_s=1e-4, finalize_s=5e-5)
    base = TRTLLM_LEGACY.with_changes(probe="constant", probe_s=probe_s)
    on = steady_period(base, host)
    off = steady_period(base.with_changes(probe_on_executor=False), host)
    assert off == pytest.approx(T + 1.5e-4, rel=1e-9)
    assert on - off == pytest.approx(probe_s, rel=1e-9)


def test_without_the_forward_sync_host_work_and_forward_overlap():
    """The loop after the forward sync went (TRTLLM_RC26's forward_sync=False): host work and
    forward overlap. Host-bound, the period is the host work alone (the walk included, the
    forward hidden behind it); forward-bound, less than their sum."""
    host = no_host(schedule_s=1e-4)
    mech = TRTLLM_LEGACY.with_changes(forward_sync=False, probe="constant")
    assert steady_period(mech.with_changes(probe_s=4e-3), host) == pytest.approx(4.1e-3, rel=1e-9)
    synced = steady_period(mech.with_changes(probe_s=2e-4, forward_sync=True), host)
    assert synced == pytest.approx(T + 3e-4, rel=1e-9)
    assert steady_period(mech.with_changes(probe_s=2e-4), host, steady=False) < synced


def test_walk_cost_per_block_grows_with_the_reused_prefix():
    hooks = TrtllmScheduling(
        TRTLLM_LEGACY.with_changes(probe="blocks", probe_block_s=1e-6), 64, BS, BS
    )
    # a miss walks one block; a 28-block hit walks 28 and the miss after them
    assert hooks.scheduled_probe_s([(0, 32 * BS)]) == pytest.approx(1e-6)
    assert hooks.scheduled_probe_s([(28 * BS, 32 * BS), (0, 4 * BS)]) == pytest.approx(30e-6)


def test_the_measured_walk_scales_with_the_prefix_it_matches():
    """64.4 ms for the reference prefix (28,672 real tokens: 1,792 simulated at scale 16), in
    proportion below and above it, one block for a miss."""
    mech = TRTLLM_LEGACY.with_changes(probe="measured")
    hooks = TrtllmScheduling(mech, 64, BS, 2, token_scale=16)
    assert hooks.scheduled_probe_s([(1792, 2048)]) == pytest.approx(64.4e-3)
    assert hooks.scheduled_probe_s([(448, 512)]) == pytest.approx(64.4e-3 / 4)
    assert hooks.scheduled_probe_s([(0, 512)]) == pytest.approx(64.4e-3 * 32 / 28672)
    constant = TrtllmScheduling(mech.with_changes(probe="constant"), 64, BS, 2, token_scale=16)
    assert constant.scheduled_probe_s([(0, 512)]) == pytest.approx(64.4e-3)


def test_reuse_becomes_visible_when_the_computing_request_retires():
    """Two copies of one prompt, one request per microbatch: the second is scheduled while the
    first is in flight. Visible on retirement, it computes the prompt again (no reuse at all);
    otherwise it reuses the first's blocks."""
    prompts = [[5] * (4 * BS)] * 2
    strict = TRTLLM_LEGACY.with_changes(
        budget_charge="prompt", reuse_on_retire=True, admit_on_schedule=True
    )
    report = run_closed_loop(trtllm_sim(strict), prompts, 2)
    assert report.num_failed == 0 and report.cached_tokens == 0
    report = run_closed_loop(trtllm_sim(strict.with_changes(reuse_on_retire=False)), prompts, 2)
    assert report.cached_tokens == 3 * BS
    # a third copy scheduled after the first retired reuses it
    report = run_closed_loop(trtllm_sim(strict), [[5] * (4 * BS)] * 3, 1)
    assert report.cached_tokens == 2 * 3 * BS


def test_requests_are_admitted_when_the_scheduler_takes_them():
    sim = trtllm_sim(TRTLLM_LEGACY.with_changes(budget_charge="prompt", admit_on_schedule=True))
    report = run_closed_loop(sim, [[i + 1] * (4 * BS) for i in range(12)], 12)
    assert report.num_failed == 0
    assert (
        max(len(w) for w in [w.chunks for w in sim.waves_sent]) == 1
    )  # 4-block prompts, a 4-block budget


@pytest.mark.parametrize("overlap, seconds", [(False, 3 * 4 * T), (True, (3 + 4 - 1) * T)])
def test_chunks_of_one_request_follow_each_other_only_when_overlapped(overlap, seconds):
    """A lone 12-block prompt under a 4-block budget: one chunk in flight at a time takes P
    iterations per chunk; overlapped (PR #9308), the chunks pipeline."""
    mech = TRTLLM_LEGACY.with_changes(overlap_chunks=overlap)
    report = run_closed_loop(trtllm_sim(mech), [[3] * (12 * BS)], 1)
    assert report.num_failed == 0
    assert (
        report.seconds == pytest.approx(seconds, rel=1e-9) if overlap else report.seconds >= seconds
    )


def test_pools_sized_to_the_smallest_rank():
    from wavepp.sim import get_hardware, get_model
    from wavepp.sim.studies.grid import WorkloadShape  # noqa: F401 - the grid's setup path
    from wavepp.sim.studies.scenario import SimSetup, build_system

    setup = SimSetup(get_model("glm-5"), get_hardware("B300"), 4, trtllm=TRTLLM_LEGACY)
    sizes = [s.pool.num_blocks for s in build_system("trtllm-pp", setup).servers]
    assert len(set(sizes)) > 1  # the ranks differ: embedding, LM head, dense layers
    rc26 = SimSetup(get_model("glm-5"), get_hardware("B300"), 4, trtllm=TRTLLM_RC26)
    assert [s.pool.num_blocks for s in build_system("trtllm-pp", rc26).servers] == [min(sizes)] * 4
    assert [s.pool.num_blocks for s in build_system("wavepp", rc26).servers] == sizes


def test_mechanisms_are_checked():
    with pytest.raises(ValueError, match="TrtllmMechanisms.probe must be one of"):
        TrtllmMechanisms(probe="fast")
    with pytest.raises(ValueError, match="'static' is the static planner"):
        MicroBatchPlanner(PlannerConfig(), TRTLLM_LEGACY, 64)
