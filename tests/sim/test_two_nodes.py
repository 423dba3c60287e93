"""Two nodes of 4 GPUs: the stage boundary between nodes and a TP/EP group's collectives go
over the NICs, everything else over NVLink."""

from dataclasses import replace

import pytest

from wavepp.sched import PlannerConfig
from wavepp.sim import SimSetup, build_sim, get_hardware, get_model, run_closed_loop, scaled_costs
from wavepp.sim.cost.expert_balance import balancedness
from wavepp.sim.cost.stage_cost import StageCostModel

HW = get_hardware("GB300")
K3 = get_model("kimi-k3")
T = 1e-3


def _setup(**kwargs):
    return SimSetup(K3, HW, 8, token_scale=16, **kwargs)


def _hop(num_tokens, *, internode):
    data = num_tokens * K3.hidden_size * 2.0  # bf16 hidden states
    if internode:
        return HW.internode_latency_s + data / (HW.internode_gb_s * 1e9)
    return HW.link_latency_s + data / (HW.link_gb_s * 1e9 / 2)


def test_only_the_boundary_between_nodes_crosses_the_nic():
    setup = _setup(gpus_per_node=4)
    assert [setup.crosses_nodes(s) for s in range(8)] == [
        False,
        False,
        False,
        True,
        False,
        False,
        False,
        True,
    ]
    costs = scaled_costs([], setup, local=False)
    for s in range(7):
        assert costs.transfer_seconds(s, 256) == pytest.approx(
            _hop(256 * 16, internode=s == 3), rel=1e-12
        )
    assert costs.result_seconds == HW.internode_latency_s  # stage 7 (node 1) -> rank 0 (node 0)
    one_node = scaled_costs([], _setup(), local=False)
    assert one_node.transfer_seconds(3, 256) == pytest.approx(
        _hop(256 * 16, internode=False), rel=1e-12
    )
    assert one_node.result_seconds == HW.link_latency_s


def test_the_stage_after_the_node_boundary_starts_later_by_exactly_the_nic_hop():
    setup = _setup(gpus_per_node=4)
    costs = replace(
        scaled_costs([], setup, local=False),
        wave_seconds=lambda stage, chunks: T,
        round_latency_s=0.0,
        round_msg_s=0.0,
        round_item_s=0.0,
        round_leased_block_s=0.0,
        round_new_block_s=0.0,
        leader_item_s=0.0,
    )
    pcfg = PlannerConfig(block_size=16, num_stages=8, static_wave_tokens=64)
    sim = build_sim("static", 8, costs, stage_num_blocks=64, block_size=16, planner_config=pcfg)
    report = run_closed_loop(sim, [[5] * 64], 1)
    span = {stage: (start, end) for stage, _, start, end in sim.wave_spans}
    gaps = [span[s + 1][0] - span[s][1] for s in range(7)]
    nic, nvlink = _hop(64 * 16, internode=True), _hop(64 * 16, internode=False)
    assert gaps == pytest.approx([nvlink] * 3 + [nic] + [nvlink] * 3, rel=1e-12)
    assert report.seconds == pytest.approx(
        8 * T + 6 * nvlink + nic + HW.internode_latency_s, rel=1e-12
    )


def _nic_ring(data):
    return 2.0 * 7 / 8 * data / (HW.internode_gb_s * 1e9) + HW.internode_latency_s


def test_tp_collectives_across_two_nodes_run_at_the_nic():
    tokens = 8192
    data = tokens * K3.hidden_size * 2.0
    assert not K3.is_moe(0) and K3.is_moe(1)
    two = StageCostModel(K3, HW, 0, K3.num_layers, degree=8, num_nodes=2)
    one = StageCostModel(K3, HW, 0, K3.num_layers, degree=8)
    # a dense layer: the attention's and the MLP's all-reduce, each a ring over the NICs
    assert two._collectives(0, tokens) == pytest.approx(2 * _nic_ring(data), rel=1e-12)
    nvlink = HW.link_gb_s * 1e9 / 2
    assert one._collectives(0, tokens) == pytest.approx(
        2 * (2.0 * 7 / 8 * data / nvlink + HW.link_latency_s), rel=1e-12
    )
    # an MoE layer: the all-reduce, then dispatch (FP8) and combine (bf16) of k copies a token,
    # 4 of 8 shares to the other node over the NIC beside 3 over NVLink, and the all-gather
    k = K3.num_experts_per_tok
    sent = tokens / 8 * k * K3.hidden_size * 3.0
    a2a = max(sent * 4 / 8 / (HW.internode_gb_s * 1e9), sent * 3 / 8 / nvlink)
    a2a /= balancedness(8, "eplb")  # the busiest expert device's share (EPLB placement)
    gather = 7 / 8 * data / (HW.internode_gb_s * 1e9)
    assert two._collectives(1, tokens) == pytest.approx(
        _nic_ring(data) + a2a + gather + 3 * HW.internode_latency_s, rel=1e-12
    )
    with pytest.raises(ValueError, match="num_nodes"):
        StageCostModel(K3, HW, 0, 1, degree=2, num_nodes=3)
