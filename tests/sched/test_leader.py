"""The leader driving real stage caches: agreement, leases, escrow, in-flight sharing, failures."""

import pytest

from wavepp.cache import BlockPool
from wavepp.sched import (
    Chunk,
    Hint,
    Leader,
    LeaderConfig,
    PlanMismatchError,
    PlannerConfig,
    Request,
    RequestState,
    StageServer,
    Wave,
    agree_prefix,
    make_planner,
    rounds,
)
from wavepp.sim import build_sim, run_closed_loop

from .conftest import grouped_prompts, linear_costs

BS = 4


def make(stage_blocks, planner="static", **kw):
    servers = [StageServer(s, BlockPool(n, BS)) for s, n in enumerate(stage_blocks)]
    cfg = PlannerConfig(block_size=BS, num_stages=len(stage_blocks), static_wave_tokens=64)
    leader = Leader(
        LeaderConfig(len(stage_blocks), BS, stage_num_blocks=tuple(stage_blocks), **kw),
        make_planner(planner, cfg),
    )
    return leader, servers


def run_round(leader, servers, now=0.0):
    """One synchronous admission round; returns its outcome."""
    return rounds.run_round(leader, lambda msg: [s.handle(msg) for s in servers], lambda: now)


def run_waves(leader, servers, now=0.0):
    """Plan and run waves through every stage until nothing is plannable."""
    from wavepp.sched import TokenResult, WaveResult

    while (wave := leader.plan_wave(now)) is not None:
        for s in servers:
            s.prepare(wave)
            s.complete(wave)
            s.pool.check_integrity()
        toks = tuple(TokenResult(c.request_id, 7, -0.5) for c in wave.chunks if c.is_last)
        leader.on_wave_result(WaveResult(wave.wave_id, toks, (1e-3,) * len(servers)), now)


def serve(leader, servers, prompts, start_id=0):
    reqs = [leader.add_request(start_id + i, p) for i, p in enumerate(prompts)]
    while not leader.idle:
        run_round(leader, servers)
        run_waves(leader, servers)
    return reqs


def seq(start, n):
    return list(range(start, start + n))


def test_agreed_prefix_is_the_minimum_over_diverged_stages():
    # stage 0 holds 8 blocks, stage 1 holds 40: after three other prompts stage 0 has evicted
    # most of prompt A, stage 1 still holds all of it
    leader, servers = make([8, 40])
    a = seq(100, 24)  # 6 blocks
    req_a = serve(leader, servers, [a], 0)[0]
    serve(leader, servers, [seq(200, 8), seq(300, 8), seq(400, 8)], 1)
    h0 = servers[0].pool.match(req_a.block_hashes).num_blocks
    h1 = servers[1].pool.match(req_a.block_hashes).num_blocks
    assert h1 == 6 and h0 < h1
    d = serve(leader, servers, [a[:20] + [9, 9, 9, 9]], 10)[0]
    assert d.state == RequestState.DONE
    assert d.num_cached_tokens == min(h0, 5) * BS
    for s in servers:
        s.pool.check_integrity()
        assert s.pool.capacity().num_leased == 0


def test_fully_cached_prompt_recomputes_its_last_block():
    leader, servers = make([16, 16])
    p = seq(10, 16)
    first, second = serve(leader, servers, [p], 0)[0], serve(leader, servers, [p], 1)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 12  # (16 - 1) // 4 blocks reused, last block computed


def test_lease_survives_eviction_pressure_until_materialized():
    leader, servers = make([10, 10])
    shared = seq(500, 16)
    serve(leader, servers, [shared + [1]], 0)  # caches 4 blocks of `shared` on both stages
    req1 = leader.add_request(1, shared + [2, 3])
    out = run_round(leader, servers)
    assert [r.request_id for r in out.admitted] == [1]
    assert req1.num_cached_tokens == 16
    leased = {s.stage_id: s.pool.match(req1.block_hashes).num_blocks for s in servers}
    # pressure: 5 more prompts of 2 blocks each want 10 blocks on a 10-block stage
    others = [leader.add_request(10 + i, seq(1000 + 100 * i, 8)) for i in range(5)]
    run_round(leader, servers)
    for s in servers:
        s.pool.check_integrity()
        assert s.pool.match(req1.block_hashes).num_blocks == leased[s.stage_id]
    run_waves(leader, servers)
    while not leader.idle:
        run_round(leader, servers)
        run_waves(leader, servers)
    assert req1.state == RequestState.DONE
    assert all(r.state == RequestState.DONE for r in others)


def test_burst_with_one_system_prompt_computes_it_once():
    leader, servers = make([64, 64], planner="static")
    system = seq(700, 32)
    prompts = [system + [i, i + 1] for i in range(6)]
    reqs = serve(leader, servers, prompts, 0)
    assert all(r.state == RequestState.DONE for r in reqs)
    computed = sum(r.num_tokens - r.num_cached_tokens for r in reqs)
    assert computed == 34 + 5 * (34 - 32)  # the 8 system blocks once, then only suffixes
    # the later requests depended on the first one's in-flight blocks
    assert all(r.num_cached_tokens == 32 for r in reqs[1:])


def test_prompt_larger_than_any_stage_fails_with_reason():
    leader, servers = make([4, 8])
    req = leader.add_request(0, seq(1, 40))
    assert req.state == RequestState.FAILED
    assert "10 blocks" in req.failure and "holds 4" in req.failure


def test_request_that_does_not_fit_beside_others_waits_for_capacity():
    leader, servers = make([6, 6], max_round_requests=8)
    reqs = [leader.add_request(0, seq(1, 20)), leader.add_request(1, seq(100, 8))]
    out = run_round(leader, servers)
    # 5 + 2 blocks on a 6-block stage: the second waits, it does not fail
    assert [r.request_id for r in out.admitted] == [0] and [r.request_id for r in out.retried] == [
        1
    ]
    assert leader.start_round(0.0) is None  # not retried before capacity changes
    while not leader.idle:
        run_waves(leader, servers)
        run_round(leader, servers)
    assert [r.state for r in reqs] == [RequestState.DONE, RequestState.DONE]


def test_request_that_cannot_fit_on_an_idle_pipeline_fails_with_the_stage_reason():
    leader, servers = make([6, 6])
    servers[1].pool = BlockPool(6, BS, max_leased_blocks=1)
    serve(leader, servers, [seq(1, 16)], 0)  # caches 4 blocks everywhere
    req = serve(leader, servers, [seq(1, 16) + [5]], 1)[0]  # wants to lease 4 > cap of 1 on stage 1
    assert req.state == RequestState.FAILED
    assert "stage 1" in req.failure and "lease" in req.failure


def test_stage_rejects_a_plan_that_disagrees_with_its_state():
    leader, servers = make([16, 16])
    leader.add_request(0, seq(1, 12))
    run_round(leader, servers)
    bad = Wave(0, (Chunk(0, 4, 12, True),))
    with pytest.raises(PlanMismatchError, match=r"\[4, 12\).*computed \[0, 0\) of 12"):
        servers[0].prepare(bad)
    with pytest.raises(PlanMismatchError, match="not admitted"):
        servers[1].prepare(Wave(1, (Chunk(99, 0, 4, False),)))


def test_hybrid_boundary_is_the_largest_common_snapshot():
    r = Request.create(0, list(range(1, 41)), BS)  # 10 blocks, 9 reusable
    hints = [Hint(0, 8, (2, 4, 6, 8)), Hint(0, 9, (3, 4, 6, 9)), Hint(0, 7, (4, 5, 6, 7))]
    assert agree_prefix(r, hints, BS) == 7
    assert agree_prefix(r, hints, BS, hybrid=True) == 6
    assert agree_prefix(r, [Hint(0, 8, (2,)), Hint(0, 8, (3,))], BS, hybrid=True) == 0


def test_closed_loop_drains_with_clean_caches():
    prompts = grouped_prompts(4, 6, prefix_len=48, suffix_len=10, seed=1)
    for policy in ("wavepp", "wavepp-mpu", "lockstep", "static"):
        sim = build_sim(
            policy,
            3,
            linear_costs(round_latency_s=1e-4),
            stage_num_blocks=[48, 80, 64],
            block_size=BS,
            check_integrity=True,
        )
        rep = run_closed_loop(sim, prompts, concurrency=8, policy=policy)
        assert rep.num_failed == 0 and rep.num_requests == len(prompts), policy
        for server in sim.servers:
            cap = server.pool.capacity()
            assert cap.num_leased == cap.num_escrowed == cap.num_pending == cap.num_in_use == 0, (
                policy
            )
            assert not server.requests
        assert sim.leader.idle


def test_planner_sees_the_requests_waiting_for_admission():
    from wavepp.sched import BalancedPlanner, CostCoefficients, CostModel

    def first_wave(num_waiting):
        servers = [StageServer(s, BlockPool(256, BS)) for s in range(4)]
        cfg = PlannerConfig(block_size=BS, num_stages=4, max_wave_tokens=64, min_wave_tokens=BS)
        coef = CostCoefficients(c_wave=1e-3, c0=0.0, g=0.0, b=1e-5, a=0.0)
        leader = Leader(
            LeaderConfig(4, BS, stage_num_blocks=(256,) * 4, max_round_requests=1),
            BalancedPlanner(cfg, CostModel(coef), overhead_frac=1e-9),
        )
        first = leader.add_request(0, seq(0, 64))
        run_round(leader, servers)  # the round takes one request: the first is plannable
        assert first.state == RequestState.ADMITTED
        for i in range(1, 1 + num_waiting):
            leader.add_request(i, seq(100 * i, 64))
        assert leader._admitting(0.0).items == [(0, 64)] * num_waiting
        return [(c.request_id, c.start, c.end) for c in leader.plan_wave(0.0).chunks]

    # alone, the first request spreads over S = 4 waves of 16 tokens
    assert first_wave(0) == [(0, 0, 16)]
    # with three more 64-token prompts waiting for a round the share is 64 tokens: all of it
    assert first_wave(3) == [(0, 0, 64)]


def test_leader_predicts_the_running_rounds_end():
    import math

    servers = [StageServer(s, BlockPool(256, BS)) for s in range(2)]
    leader = Leader(
        LeaderConfig(2, BS, stage_num_blocks=(256, 256), max_round_requests=1),
        make_planner("balanced", PlannerConfig(block_size=BS, num_stages=2)),
    )
    clock = iter([0.0, 0.001])  # a round from 0 to 4 ms: start, probe replies, end (lease replies)
    leader.add_request(0, seq(0, 16))
    rounds.run_round(
        leader, lambda msg: [s.handle(msg) for s in servers], lambda: next(clock, 0.004)
    )
    leader.add_request(1, seq(100, 16))
    leader.add_request(2, seq(200, 16))
    assert leader._admitting(0.0).round_left_s == math.inf  # no round running
    step = leader.start_round(0.010)
    assert step is not None and leader.round is not None
    admitting = leader._admitting(0.011)
    # request 1 in the round, request 2 waiting; the round ends ~4 ms after it started
    assert admitting.items == [(0, 16), (0, 16)] and admitting.in_round == 1
    assert admitting.round_left_s == pytest.approx(0.003)
    assert leader._admitting(0.020).round_left_s == 0.0  # overdue: any moment now
