"""Every simulated system end to end on a small case (cache integrity checked after every
event), SGLang's dynamic chunk sizes against their formula, and wavepp vs lockstep."""

import math

import pytest

from wavepp.sched import CostCoefficients, CostModel, DynamicChunkPlanner, PlannerConfig
from wavepp.sim import (
    HARDWARE,
    MODELS,
    SYSTEMS,
    SimSetup,
    build_system,
    run_setting,
    stage_kv_tokens,
)
from wavepp.workloads import make_workload


def planner(base=4096, smooth=0.75, a=1e-9, b=1e-5):
    cost = CostModel(CostCoefficients(c_wave=0.0, c0=0.0, g=0.0, b=b, a=a))
    return DynamicChunkPlanner(PlannerConfig(block_size=16, static_wave_tokens=base), cost, smooth)


def test_dynamic_chunk_solves_for_the_initial_chunk_time():
    p = planner(smooth=1.0)
    assert p.chunk_budget(0) == 4096
    a, b, base, L = 1e-9, 1e-5, 4096, 16384
    x = p.chunk_budget(L)
    # f(L + x) - f(L) = f(base) - f(0) for f(l) = a l^2 + b l, to within one block
    target = a * base**2 + b * base

    def cost(n):
        return a * ((L + n) ** 2 - L**2) + b * n

    assert cost(x) <= target < cost(x + 16)
    assert x % 16 == 0


def test_dynamic_chunk_smooths_floors_and_aligns():
    p = planner(smooth=0.75)
    sizes = [p.chunk_budget(L) for L in (0, 4096, 16384, 65536, 10**7)]
    assert sizes == sorted(sizes, reverse=True)
    assert all(s % 16 == 0 and s >= 4096 // 4 for s in sizes)
    a, b, base, L = 1e-9, 1e-5, 4096, 16384
    lin, target = 2 * a * L + b, a * base**2 + b * base
    root = (-lin + math.sqrt(lin * lin + 4 * a * target)) / (2 * a)
    assert sizes[2] == int(base + 0.75 * (root - base)) // 16 * 16
    assert {planner(smooth=0.0).chunk_budget(L) for L in (0, 10**6)} == {4096}
    with pytest.raises(ValueError, match="smooth"):
        planner(smooth=1.5)


def small_setup(model="glm-5", devices=4, **kwargs):
    return SimSetup(
        MODELS[model],
        HARDWARE["B300"],
        devices,
        token_scale=64,
        block_size=8,
        max_wave_tokens=32768,
        max_round_requests=16,
        **kwargs,
    )


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_every_system_finishes_every_request_with_intact_caches(system):
    setup = small_setup(max_pool_blocks=1024)  # integrity checks walk every block
    work = make_workload(
        "short_suffix",
        num_requests=12,
        num_groups=3,
        prefix_len=128,
        suffix_len=32,
        block_size=8,
        seed=1,
    )
    result, sim = run_setting(system, setup, work, 6, check_integrity=True)
    assert result.num_failed == 0 and result.num_requests == 12
    assert result.input_tok_s > 0 and 0 < result.hit_rate <= work.ideal_hit_rate + 1e-9
    assert sim.leader.idle
    for server in sim.servers:
        cap = server.pool.capacity()
        assert cap.num_leased == cap.num_escrowed == cap.num_in_use == 0


def test_topologies_and_rings_of_the_baselines():
    setup = small_setup()
    per_stage = [
        stage_kv_tokens(setup.model, setup.hardware, a, b, first=i == 0, last=i == 3)
        # GLM-5's 78 layers balanced with the LM head on the last stage: 20, 20, 19, 19
        for i, (a, b) in enumerate([(0, 20), (20, 40), (40, 59), (59, 78)])
    ]
    vllm = build_system("vllm-pp", setup)
    assert len(vllm.servers) == 1 and vllm.num_stages == 4
    assert vllm.servers[0].pool.num_blocks == min(per_stage) // (8 * 64)
    assert vllm.leader.config.waves_in_flight_cap == 4
    tp = build_system("tp-ep", setup)
    assert tp.num_stages == 1 and len(tp.servers) == 1
    wave = build_system("wavepp", setup)
    assert len(wave.servers) == 4 and wave.leader.config.waves_in_flight_cap == 8
    assert [s.pool.num_blocks for s in wave.servers] == [t // (8 * 64) for t in per_stage]
    assert build_system("sglang-pp", setup).leader.config.waves_in_flight_cap == 4


@pytest.mark.parametrize("interval", [0, 4])
def test_hybrid_model_runs_with_snapshot_boundaries(interval):
    # integrity checks walk every block
    setup = small_setup("kimi-linear", max_pool_blocks=512, snapshot_interval_blocks=interval)
    work = make_workload(
        "reuse", num_requests=8, num_groups=2, prompt_len=160, block_size=8, seed=2
    )
    result, sim = run_setting("wavepp", setup, work, 4, check_integrity=True)
    assert sim.leader.config.hybrid and result.num_failed == 0
    assert result.hit_rate <= work.ideal_hit_rate + 1e-9
    if interval:
        # real snapshots every 4 blocks: requests 4-7 resume from their group's prefix, each
        # at the last grid point inside it, whatever chunks computed it
        assert hasattr(sim.servers[0].pool, "match_snapshots")
        assert result.hit_rate > 0


def test_wavepp_beats_lockstep_on_short_suffixes_at_high_concurrency():
    setup = small_setup()
    work = make_workload(
        "short_suffix",
        num_requests=96,
        num_groups=8,
        prefix_len=448,
        suffix_len=64,
        block_size=8,
        seed=3,
    )
    wave, _ = run_setting("wavepp", setup, work, 48)
    lock, _ = run_setting("lockstep", setup, work, 48)
    assert wave.num_failed == lock.num_failed == 0
    assert wave.input_tok_s > 1.2 * lock.input_tok_s
    assert lock.idle_admission_frac > wave.idle_admission_frac


def test_open_loop_replays_the_arrival_times(tmp_path):
    lines = [
        '{"timestamp": %d, "input_length": 1500, "hash_ids": [1, 2, %d]}' % (t, 10 + t)
        for t in (0, 250, 1250)
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    from wavepp.workloads import trace

    setup = small_setup(max_pool_blocks=256)
    work = trace(path, tokens_per_block=8, block_size=8, time_scale=2.0)
    result, sim = run_setting("wavepp", setup, work, 1, check_integrity=True)
    assert result.num_failed == 0 and result.num_requests == 3
    assert [sim.records[i].arrival for i in range(3)] == [0.0, 0.5, 2.5]
    assert result.hit_rate == pytest.approx(work.ideal_hit_rate)


def test_policies_come_from_one_registry():
    from wavepp.sched.policy import POLICIES, bench_policies, get_policy, runtime_policies
    from wavepp.sim.studies.systems import SYSTEMS

    assert list(SYSTEMS) == list(POLICIES)
    assert all(SYSTEMS[name].policy is POLICIES[name] for name in POLICIES)
    assert "vllm-pp" not in runtime_policies() and bench_policies()[-1] == "single-stage"
    with pytest.raises(
        ValueError, match="unknown policy 'vllm-pp'; choose one of wavepp, wavepp-mpu"
    ):
        get_policy("vllm-pp", runtime=True)
    with pytest.raises(ValueError, match="unknown policy 'x'; choose one of .*tp-ep"):
        get_policy("x")
