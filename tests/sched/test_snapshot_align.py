"""Hybrid models: planners move chunk ends onto snapshot boundaries when that costs little."""

import random
from dataclasses import replace

import pytest

from wavepp.sched import (
    BalancedPlanner,
    CostCoefficients,
    CostModel,
    PlannerConfig,
    Request,
    StaticPlanner,
    make_planner,
)
from wavepp.sched.planners import align_chunk_ends
from wavepp.sim import build_sim, run_closed_loop

from .conftest import grouped_prompts, linear_costs

BS = 16
GRID = 4 * BS  # interval 4 blocks: grid points every 64 tokens


def req(rid, num_tokens, scheduled=0):
    r = Request.create(rid, [1 + (i * 7 + rid) % 11 for i in range(num_tokens)], BS)
    r.num_cached_tokens = r.num_scheduled_tokens = scheduled
    return r


def spans(chunks):
    return [(c.request_id, c.start, c.end, c.is_last) for c in chunks]


def hybrid(**kw):
    return PlannerConfig(block_size=BS, num_stages=2, snapshot_interval_blocks=4, **kw)


def test_a_chunk_end_moves_down_to_a_grid_point_within_the_tolerance():
    # budget 208: the cut at 208 is 16 tokens past the grid point 192 (tolerance 208 / 8 -> 16)
    chunks = StaticPlanner(hybrid(static_wave_tokens=208)).plan([req(0, 1000)])
    assert spans(chunks) == [(0, 0, 192, False)]
    # 240 is 48 past 192 and 16 short of 256 (tolerance 240 / 8 -> 16): up, but the wave is full
    assert spans(StaticPlanner(hybrid(static_wave_tokens=240)).plan([req(0, 1000)])) == [
        (0, 0, 240, False)
    ]
    # a resumed request: grid points are absolute positions, not offsets from its start
    assert spans(
        StaticPlanner(hybrid(static_wave_tokens=160)).plan([req(0, 1000, scheduled=48)])
    ) == [(0, 48, 192, False)]
    # the last chunk of a request never moves
    assert spans(StaticPlanner(hybrid(static_wave_tokens=208)).plan([req(0, 200)])) == [
        (0, 0, 200, True)
    ]


def test_the_last_reusable_boundary_is_a_target_and_up_needs_room():
    r = req(0, 1000)
    chunk = StaticPlanner(hybrid(static_wave_tokens=2000, snapshot_align_frac=0.0)).plan([r])[0]
    assert chunk.end == 1000
    config = hybrid()
    cut = replace(chunk, end=976, is_last=False)
    # 976 is 16 past the grid point 960 and 16 short of the last reusable boundary 992 (= 999 // 16 * 16)
    assert spans(align_chunk_ends([cut], [r], config, room=0)) == [(0, 0, 960, False)]
    near_end = replace(chunk, end=992 - 32, is_last=False)  # on the grid already: unchanged
    assert spans(align_chunk_ends([near_end], [r], config, room=100)) == [(0, 0, 960, False)]
    off = replace(
        chunk, start=800, end=944, is_last=False
    )  # 144 tokens: tolerance 16; 960 is 16 up
    assert spans(align_chunk_ends([off], [r], config, room=15)) == [(0, 800, 944, False)]
    assert spans(align_chunk_ends([off], [r], config, room=16)) == [(0, 800, 960, False)]
    # up to the request's end: the chunk becomes its last
    short = req(1, 150)
    c = StaticPlanner(hybrid(static_wave_tokens=128)).plan([short])[0]
    assert (c.end, c.is_last) == (128, False)  # on the grid (128 = 2 * 64): stays
    c2 = replace(c, end=144)  # 144: last reusable boundary (149 // 16 * 16), a target itself
    assert spans(align_chunk_ends([c2], [short], config, room=100)) == [(1, 0, 144, False)]


def test_dense_models_plan_exactly_as_before():
    """snapshot_interval_blocks 0 (no linear-attention layers): every planner's waves are the
    ones it plans with alignment off, wave by wave over a whole run."""
    rng = random.Random(0)
    lengths = [rng.randrange(20, 900) for _ in range(30)]
    cost = CostCoefficients(c_wave=1e-3, c0=1e-4, g=1e-7, b=1e-5, a=1e-9)
    for name in ("static", "mpu", "balanced", "dynamic"):
        waves = []
        for config in (
            PlannerConfig(block_size=BS, num_stages=2),
            PlannerConfig(block_size=BS, num_stages=2, snapshot_align_frac=0.0),
        ):
            kwargs = {"cost_model": CostModel(cost)} if name in ("balanced", "dynamic") else {}
            waves.append(
                _drain(
                    make_planner(name, config, **kwargs), [req(i, n) for i, n in enumerate(lengths)]
                )
            )
        assert waves[0] == waves[1], name
        # and a hybrid grid does change them (the comparison above could not pass vacuously)
        kwargs = {"cost_model": CostModel(cost)} if name in ("balanced", "dynamic") else {}
        aligned = _drain(
            make_planner(
                name,
                replace(config, snapshot_interval_blocks=4, snapshot_align_frac=0.125),
                **kwargs,
            ),
            [req(i, n) for i, n in enumerate(lengths)],
        )
        assert aligned != waves[0], name


@pytest.mark.parametrize("name", ["static", "mpu", "balanced", "dynamic"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aligned_waves_keep_every_token_and_the_budget(name, seed):
    """Over whole runs: each request's chunks tile [cached, num_tokens); a moved end is a
    snapshot boundary at most the tolerance away; a wave holds at most the tokens the same
    planner without alignment planned for it (the wave's budget) plus nothing when it was full."""
    rng = random.Random(seed)
    lengths = [rng.randrange(20, 1500) for _ in range(25)]
    cached = [rng.randrange(0, n // BS) * BS if rng.random() < 0.3 else 0 for n in lengths]
    cost = CostCoefficients(c_wave=1e-3, c0=1e-4, g=1e-7, b=1e-5, a=1e-9)

    def kwargs():
        return {"cost_model": CostModel(cost)} if name in ("balanced", "dynamic") else {}

    config = hybrid(max_wave_tokens=512, static_wave_tokens=384)
    requests = [req(i, n, c) for i, (n, c) in enumerate(zip(lengths, cached))]
    planner = make_planner(name, config, **kwargs())
    plain = make_planner(name, replace(config, snapshot_align_frac=0.0), **kwargs())
    tiles = {r.request_id: [] for r in requests}
    num_on_grid = num_moved = 0
    live = list(requests)
    while live:
        # the same state planned both ways: the plain wave is what alignment starts from
        before = plain.plan(live)
        chunks = planner.plan(live)
        assert [c.request_id for c in chunks] == [c.request_id for c in before]
        budget = sum(c.num_tokens for c in before)
        for c, b in zip(chunks, before):
            r = next(x for x in live if x.request_id == c.request_id)
            assert c.start == b.start == r.num_scheduled_tokens
            if c.end != b.end:
                num_moved += 1
                tol = int(config.snapshot_align_frac * b.num_tokens) // BS * BS
                assert abs(c.end - b.end) <= tol
                assert not b.is_last
                assert c.end % GRID == 0 or c.end == (r.num_tokens - 1) // BS * BS or c.is_last
            if not c.is_last:
                num_on_grid += c.end % GRID == 0
            tiles[c.request_id].append((c.start, c.end))
        if name != "balanced":  # packing fills the budget: aligned waves never take more
            assert sum(c.num_tokens for c in chunks) <= budget
        else:  # the balanced planner rounds up only within its token cap
            assert sum(c.num_tokens for c in chunks) <= config.max_wave_tokens
        for c in chunks:
            r = next(x for x in live if x.request_id == c.request_id)
            r.num_scheduled_tokens = r.num_computed_tokens = c.end
        for p in (planner, plain):
            if isinstance(p, BalancedPlanner):
                p._in_flight.clear()
        live = [r for r in live if r.num_unscheduled_tokens > 0]
    for r, c in zip(requests, cached):
        ends = [c] + [e for _, e in tiles[r.request_id]]
        assert [s for s, _ in tiles[r.request_id]] == ends[:-1]
        assert ends[-1] == r.num_tokens
    assert num_moved > 0 and num_on_grid > 0


def test_leader_runs_hybrid_waves_on_the_grid():
    """The leader with real snapshot pools: chunk ends land on the grid, every request
    finishes, and the stage caches stay consistent (check_integrity after every event)."""
    prompts = grouped_prompts(4, 6, prefix_len=300, suffix_len=140, seed=3)
    results = {}
    for frac in (0.0, 0.125):
        pcfg = PlannerConfig(
            block_size=BS, num_stages=2, static_wave_tokens=200, snapshot_align_frac=frac
        )
        sim = build_sim(
            "static",
            2,
            linear_costs(),
            stage_num_blocks=400,
            block_size=BS,
            planner_config=pcfg,
            check_integrity=True,
            hybrid=True,
            snapshot_interval_blocks=4,
        )
        ends = []
        plan_wave = sim.leader.plan_wave

        def recording(now, plan_wave=plan_wave, ends=ends):
            wave = plan_wave(now)
            ends.extend(c.end for c in (wave.chunks if wave else ()) if not c.is_last)
            return wave

        sim.leader.plan_wave = recording
        report = run_closed_loop(sim, prompts, concurrency=6)
        assert report.num_failed == 0
        assert sim.leader.planner.config.snapshot_interval_blocks == 4
        results[frac] = (sum(e % GRID == 0 for e in ends) / len(ends), report)
    assert results[0.125][0] > results[0.0][0]
    assert results[0.125][1].input_tokens == results[0.0][1].input_tokens


def _drain(planner, requests):
    waves = []
    live = list(requests)
    while live:
        chunks = planner.plan(live)
        waves.append(spans(chunks))
        for c in chunks:
            r = next(x for x in live if x.request_id == c.request_id)
            r.num_scheduled_tokens = r.num_computed_tokens = c.end
        if isinstance(planner, BalancedPlanner):
            planner._in_flight.clear()
        live = [r for r in live if r.num_unscheduled_tokens > 0]
    return waves
