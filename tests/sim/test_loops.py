"""The outside loops (sim/loops/loop_sim.py) against their analytic periods.

A flow of identical microbatches: one request of W tokens per microbatch, compute T on every
rank, no transfer time, a closed loop deep enough that rank 0 always has the next one. The
period is the spacing of rank 0's forward starts once the pipeline is full.

TensorRT-LLM (`_executor_loop_pp`): a non-last rank's `_forward_step_inter_pp` synchronizes
on its forward, so each iteration runs its host work and its forward one after the other:
fetch + schedule, forward (T), relay, finalize. The neighbours keep that pace (rank k+1's
fetch and schedule for iteration i come from rank k's iteration i, and the sample state of
the batch P-1 iterations back is ready long before it is needed), so

    period = T + fetch_s + schedule_s + relay_s + finalize_s.

SGLang (`event_loop_pp`): the GPU runs ahead of the host, but a rank sends the request list of
slot mb on only after it received and processed the outputs of slot mb+1, and every rank but
rank 0 receives those outputs as the carry its neighbour sends one slot later. So the request
list of batch i reaches the last rank only after the sampled ids of batch i-1 have gone round
the whole ring, one hop and one processing (relay_s + finalize_s) on each of the P ranks; the
last rank then fetches and schedules (fetch_s + schedule_s) and computes (T):

    period = T + fetch_s + schedule_s + P * (hop_s + relay_s + finalize_s).
"""

import pytest

from wavepp.sched import PlannerConfig
from wavepp.sim import SimCosts, build_sim, run_closed_loop
from wavepp.sim.loops.loop_costs import LoopCosts

BS, W, T = 16, 64, 1e-3


def steady_period(loop: str, num_stages: int, costs: LoopCosts, num_requests: int = 24) -> float:
    pcfg = PlannerConfig(block_size=BS, num_stages=num_stages, static_wave_tokens=W)
    sim = build_sim(
        "static",
        num_stages,
        SimCosts(wave_seconds=lambda stage, chunks: T),
        stage_num_blocks=256,
        block_size=BS,
        planner_config=pcfg,
        max_waves_in_flight=num_stages,
        loop=loop,
        loop_costs=costs,
    )
    report = run_closed_loop(sim, [[i + 1] * W for i in range(num_requests)], 4 * num_stages)
    assert report.num_failed == 0 and report.hit_rate == 0
    starts = sorted(start for stage, _, start, _ in sim.wave_spans if stage == 0)
    assert len(starts) == num_requests
    gaps = [b - a for a, b in zip(starts, starts[1:])][num_requests // 2 :]
    assert max(gaps) == pytest.approx(min(gaps), rel=1e-9)  # a steady period
    return gaps[0]


def costs(fetch=0.0, schedule=0.0, relay=0.0, finalize=0.0, hop=0.0) -> LoopCosts:
    return LoopCosts(
        fetch_s=fetch,
        schedule_s=schedule,
        schedule_item_s=0.0,
        match_block_s=0.0,
        alloc_block_s=0.0,
        relay_s=relay,
        hop_s=hop,
        finalize_s=finalize,
    )


CASES = [
    (2, costs()),
    (4, costs(schedule=3e-4)),
    (3, costs(1e-5, 2e-5, 4e-5, 8e-5)),
    (4, costs(7e-5, 1e-5, 3e-5, 1e-5)),
    (5, costs(0, 3e-5, 7e-5, 2e-5)),
]


@pytest.mark.parametrize("num_stages, c", CASES)
def test_trtllm_period_is_compute_plus_every_host_step(num_stages, c):
    expected = T + c.fetch_s + c.schedule_s + c.relay_s + c.finalize_s
    assert steady_period("trtllm", num_stages, c) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "num_stages, c", CASES + [(2, costs(hop=7e-5)), (5, costs(1e-5, 0, 3e-5, 0, 7e-5))]
)
def test_sglang_period_is_compute_plus_schedule_plus_the_outputs_round_the_ring(num_stages, c):
    expected = T + c.fetch_s + c.schedule_s + num_stages * (c.hop_s + c.relay_s + c.finalize_s)
    assert steady_period("sglang", num_stages, c) == pytest.approx(expected, rel=1e-9)


def test_a_request_has_one_chunk_in_flight_in_trtllm_and_several_in_sglang():
    """TensorRT-LLM's in-flight request ids: a long prompt's chunks go one at a time, each one
    after the previous came back, so a lone request takes P iterations per chunk."""
    pcfg = PlannerConfig(block_size=BS, num_stages=4, static_wave_tokens=W)
    sim = build_sim(
        "static",
        4,
        SimCosts(wave_seconds=lambda stage, chunks: T),
        stage_num_blocks=256,
        block_size=BS,
        planner_config=pcfg,
        max_waves_in_flight=4,
        check_integrity=True,
        loop="trtllm",
        loop_costs=costs(),
    )
    report = run_closed_loop(sim, [[3] * (3 * W)], 1)
    assert report.num_failed == 0 and sim.stats[0].num_waves == 3
    # each chunk crosses 4 stages (4T) and is retired by rank 0 before the next is scheduled
    assert report.seconds >= 3 * 4 * T
    sim = build_sim(
        "static",
        4,
        SimCosts(wave_seconds=lambda stage, chunks: T),
        stage_num_blocks=256,
        block_size=BS,
        planner_config=pcfg,
        max_waves_in_flight=4,
        check_integrity=True,
        loop="sglang",
        loop_costs=costs(),
    )
    report = run_closed_loop(sim, [[3] * (3 * W)], 1)
    assert report.num_failed == 0 and report.seconds == pytest.approx((3 + 4 - 1) * T, rel=1e-9)


def test_loop_costs_are_checked():
    with pytest.raises(ValueError, match="LoopCosts.hop_s must be >= 0"):
        LoopCosts(hop_s=-1.0)
