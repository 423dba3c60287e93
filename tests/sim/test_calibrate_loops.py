"""The outside loops on a fitted CPU "hardware": the runtime's budgets, slots and serial chunks,
and host costs taken from the runtime's own per-iteration exchanges."""

import pytest

from wavepp.sched import CostCoefficients
from wavepp.sim import CpuHardware, LoopSim, loop_costs_from_rounds, run_closed_loop

STAGE = CostCoefficients(c_wave=1e-3, c0=1e-4, g=0.0, b=2e-5, a=0.0)


def test_loop_costs_come_from_the_measured_exchanges():
    spans = [(-1, 0.0, 2e-4), (-1, 1.0, 1.0004), (-1, 2.0, 2.0003), (7, 3.0, 3.0013)]
    lc = loop_costs_from_rounds(spans)
    assert lc.hop_s == pytest.approx(3e-4 / 2)  # the median empty exchange, one way
    assert lc.schedule_s == pytest.approx((2e-4 + 4e-4 + 3e-4 + 13e-4) / 4)
    assert lc.match_block_s == lc.alloc_block_s == lc.schedule_item_s == 0
    with pytest.raises(ValueError, match="no round spans"):
        loop_costs_from_rounds([])


def test_the_loops_are_built_as_the_runtime_runs_them():
    cpu = CpuHardware((STAGE, STAGE))
    trt, sgl = cpu.build("trtllm-pp"), cpu.build("sglang-pp")
    assert isinstance(trt, LoopSim) and isinstance(sgl, LoopSim)
    assert trt.leader.config.serial_chunks and not sgl.leader.config.serial_chunks
    assert trt.leader.config.waves_in_flight_cap == sgl.leader.config.waves_in_flight_cap == 2
    assert trt.leader.planner.config.static_wave_tokens == 256
    assert sgl.leader.planner.name == "dynamic" and sgl.leader.planner.base == 512


@pytest.mark.parametrize("policy", ["trtllm-pp", "sglang-pp"])
def test_measured_host_cost_slows_the_loop_by_its_share(policy):
    """Identical one-block prompts, one microbatch each: rank 0's host cost h adds to every
    iteration, so throughput falls as 1 / (T + h) where rank 0 paces the pipeline."""
    cpu = CpuHardware((STAGE, STAGE))
    prompts = [[i + 1] * 16 for i in range(40)]
    seconds = {}
    for h in (0.0, 2e-3):
        lc = loop_costs_from_rounds([(-1, 0.0, h)])
        sim = cpu.build(policy, stage_num_blocks=256, loop_costs=lc, check_integrity=True)
        rep = run_closed_loop(sim, prompts, 1)
        assert rep.num_failed == 0
        seconds[h] = rep.seconds
    assert seconds[2e-3] > seconds[0.0] + 40 * 2e-3 * 0.9
