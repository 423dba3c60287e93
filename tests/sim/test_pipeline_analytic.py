"""The pipeline in virtual time against exact flow-shop formulas.

S stages, M micro-batches (waves) with times t_w, the same on every stage, no transfer or
admission cost: the last wave leaves the last stage at sum(t) + (S - 1) * max(t); with equal
times, (M + S - 1) * t, so the bubble fraction is (S - 1) / (M + S - 1). With per-stage times
t_s instead, the bottleneck stage paces it: sum(t_s) + (M - 1) * max(t_s).
"""

import pytest

from wavepp.sched import CostCoefficients, PlannerConfig
from wavepp.sim import CpuHardware, SimCosts, build_sim, run_closed_loop
from wavepp.sim.studies.sim_setup import AdmissionCosts

BS = 16
FREE = AdmissionCosts(
    round_latency_s=0,
    msg_s=0,
    item_s=0,
    leased_block_s=0,
    new_block_s=0,
    leader_item_s=0,
    block_tokens=BS,
)


def one_request_in_waves(policy, num_stages, num_waves, wave_tokens, costs, **kwargs):
    """A single prompt cut by the static budget into `num_waves` chunks, all in flight together."""
    pcfg = PlannerConfig(block_size=BS, num_stages=num_stages, static_wave_tokens=wave_tokens)
    sim = build_sim(
        policy,
        num_stages,
        costs,
        stage_num_blocks=256,
        block_size=BS,
        planner_config=pcfg,
        check_integrity=True,
        **kwargs,
    )
    report = run_closed_loop(sim, [[7] * (num_waves * wave_tokens)], 1)
    assert report.num_failed == 0 and sim.stats[0].num_waves == num_waves
    return sim, report


@pytest.mark.parametrize("num_stages, num_waves", [(2, 3), (4, 4), (4, 8), (3, 6)])
def test_equal_waves_finish_in_m_plus_s_minus_one_wave_times(num_stages, num_waves):
    t = 1e-3
    costs = SimCosts(wave_seconds=lambda stage, chunks: t)
    sim, report = one_request_in_waves("static", num_stages, num_waves, 64, costs)
    assert report.seconds == pytest.approx((num_waves + num_stages - 1) * t, rel=1e-12)
    busy = sum(st.busy_s for st in sim.stats)
    bubble = 1 - busy / (num_stages * report.seconds)
    assert bubble == pytest.approx((num_stages - 1) / (num_waves + num_stages - 1), rel=1e-9)


def test_unequal_wave_times_finish_in_sum_plus_s_minus_one_max():
    # chunk k of a prompt costs more the more tokens precede it (the attention term)
    cpu = CpuHardware(
        (CostCoefficients(c_wave=1e-3, c0=2e-4, g=1e-6, b=1e-5, a=1e-8),) * 3, admission=FREE
    )
    pcfg = PlannerConfig(block_size=BS, num_stages=3, static_wave_tokens=128)
    sim = cpu.build(
        "static", stage_num_blocks=256, block_size=BS, planner_config=pcfg, check_integrity=True
    )
    report = run_closed_loop(sim, [[3] * 768], 1)
    model = sim.costs.wave_seconds
    times = [model(0, [(k * 128, 128)]) for k in range(6)]
    assert len(set(times)) == 6
    assert report.seconds == pytest.approx(sum(times) + 2 * max(times), rel=1e-12)


def test_per_stage_times_are_paced_by_the_slowest_stage():
    t = [1e-3, 3e-3, 2e-3]
    costs = SimCosts(wave_seconds=lambda stage, chunks: t[stage])
    _, report = one_request_in_waves("static", 3, 5, 64, costs)
    assert report.seconds == pytest.approx(sum(t) + (5 - 1) * max(t), rel=1e-12)


def test_transfers_and_result_return_add_to_the_critical_path():
    t, hop, back = 1e-3, 2e-4, 5e-5
    costs = SimCosts(
        wave_seconds=lambda stage, chunks: t,
        transfer_seconds=lambda stage_id, n: hop,
        result_seconds=back,
    )
    _, report = one_request_in_waves("static", 4, 1, 64, costs)
    assert report.seconds == pytest.approx(4 * t + 3 * hop + back, rel=1e-12)


def test_central_pool_runs_the_same_pipeline_with_one_scheduler_pool():
    t = 1e-3
    costs = SimCosts(wave_seconds=lambda stage, chunks: t)
    sim, report = one_request_in_waves("static", 4, 6, 64, costs, central_pool=True)
    assert len(sim.servers) == 1 and sim.num_stages == 4
    assert report.seconds == pytest.approx((6 + 4 - 1) * t, rel=1e-12)
    assert all(st.num_waves == 6 for st in sim.stats)
