"""Planners on hand-computed cases."""

import math

import pytest

from wavepp.sched import (
    Admitting,
    BalancedPlanner,
    CostCoefficients,
    CostModel,
    MpuPlanner,
    PlannerConfig,
    Request,
    RequestState,
    StaticPlanner,
    budget_ladder,
    make_planner,
)


def req(rid, num_tokens, scheduled=0):
    r = Request.create(rid, [1 + (i % 7) for i in range(num_tokens)], 16)
    r.num_cached_tokens = r.num_scheduled_tokens = scheduled
    return r


def spans(chunks):
    return [(c.request_id, c.start, c.end, c.is_last) for c in chunks]


def test_budget_ladder_halves_and_aligns():
    assert budget_ladder(2048, 64, 16) == [2048, 1024, 512, 256, 128, 64]
    assert budget_ladder(1000, 100, 16) == [992, 496, 240, 112, 96]
    assert budget_ladder(64, 64, 16) == [64]


def test_static_packs_fcfs_with_aligned_cuts():
    cfg = PlannerConfig(block_size=16, num_stages=2, static_wave_tokens=100)
    planner = StaticPlanner(cfg)
    a, b, c = req(0, 40), req(1, 70, scheduled=16), req(2, 30)
    # a whole (40); b: 60 left of budget, 54 left of b -> whole (70 is its end); c: 6 left < a block
    assert spans(planner.plan([a, b, c])) == [(0, 0, 40, True), (1, 16, 70, True)]
    big = req(3, 300)
    # a cut that is not the end of the request is aligned down to the block size
    assert spans(planner.plan([a, big])) == [(0, 0, 40, True), (3, 0, 48, False)]


def test_mpu_proposal_follows_the_formula():
    cfg = PlannerConfig(block_size=16, num_stages=2, max_wave_tokens=2048, min_wave_tokens=64)
    planner = MpuPlanner(cfg)
    assert planner.ring == 4 and planner.target_waves == 6  # R = 2P, S = R + (F-1)P
    # W = 8 * 1000 = 8000 tokens; n(2048) = max(3.9, 0) < 6; n(1024) = max(7.8, 8) >= 6
    reqs = [req(i, 1000) for i in range(8)]
    assert planner.propose(reqs) == 1024
    # W = 4 * 100 = 400: n(b) = max(400/b, N_{>b/2}); n(64) = max(6.25, 4) >= 6 -> 64
    assert planner.propose([req(i, 100) for i in range(4)]) == 64
    # many short requests: N_{>b/2} counts them: 7 requests of 200 tokens: n(256) = max(5.5, 7) >= 6
    assert planner.propose([req(i, 200) for i in range(7)]) == 256


def test_mpu_hysteresis_raises_after_half_ring_and_lowers_after_p():
    cfg = PlannerConfig(block_size=16, num_stages=2, max_wave_tokens=2048, min_wave_tokens=64)
    planner = MpuPlanner(cfg)
    assert planner.budget == 2048
    assert planner.decide(512) == 2048  # 1st lower proposal
    assert planner.decide(512) == 512  # P = 2 consecutive -> lowered
    assert planner.decide(1024) == 512  # 1st raise proposal
    assert planner.decide(1024) == 1024  # R/2 = 2 consecutive -> raised
    assert planner.decide(256) == 1024
    assert planner.decide(1024) == 1024  # streak broken by an equal proposal
    assert planner.decide(256) == 1024


def test_mpu_packing_skips_fragments_below_half_budget():
    cfg = PlannerConfig(block_size=16, num_stages=1, max_wave_tokens=256, min_wave_tokens=64)
    planner = MpuPlanner(cfg)
    planner.budget = 256
    planner.propose = lambda reqs: 256
    a, b, c = req(0, 160), req(1, 500), req(2, 80)
    # a takes 160, 96 left < max(64, 128): b would be a fragment -> skipped; c (80) fits whole
    assert spans(planner.plan([a, b, c])) == [(0, 0, 160, True), (2, 0, 80, True)]


def test_balanced_target_spreads_work_over_target_waves():
    # pure linear cost: 1 ms per wave, 1 ms per chunk, 10 us per token
    coef = CostCoefficients(c_wave=1e-3, c0=1e-3, g=0.0, b=1e-5, a=0.0)
    cfg = PlannerConfig(block_size=16, num_stages=2, max_wave_tokens=4096, min_wave_tokens=16)
    planner = BalancedPlanner(cfg, CostModel(coef))
    reqs = [req(0, 4096)]
    planner.overhead_frac = 1e-9  # no efficiency cap in this case
    # work = 1e-3 + 4096e-5 = 41.96 ms spread over P = 2 waves -> T = 1 ms + 20.98 ms
    assert planner.target_time(reqs) == pytest.approx(1e-3 + (1e-3 + 4096e-5) / 2)
    # x with c0 + b x <= T - c_wave: x = 1998 -> aligned down to 1984
    assert spans(planner.plan(reqs)) == [(0, 0, 1984, False)]
    # with the default 3% cap: fixed costs 2 ms -> T <= 66.7 ms (an M = 8192 wave costs 84 ms);
    # 8 such requests spread over 2 waves (168 ms) are capped there
    wide = BalancedPlanner(
        PlannerConfig(block_size=16, num_stages=2, max_wave_tokens=8192), CostModel(coef)
    )
    many = [req(i, 4096) for i in range(8)]
    assert wide.target_time(many) == pytest.approx(2e-3 / 0.03)


def test_balanced_equal_predicted_wave_times():
    # attention-heavy cost: after long prefixes, fewer tokens fill the same time
    coef = CostCoefficients(c_wave=1e-3, c0=2e-4, g=1e-7, b=1e-5, a=1e-9)
    cfg = PlannerConfig(block_size=16, num_stages=2, max_wave_tokens=1024, min_wave_tokens=16)
    planner = BalancedPlanner(cfg, CostModel(coef), overhead_frac=1e-9)
    cost = planner.cost
    reqs = [req(0, 40000, scheduled=12000), req(1, 40000, scheduled=4000)]
    # plenty of work: clamped at the first M tokens at hand, FCFS (what an M-token budget sends)
    assert planner.target_time(reqs) == pytest.approx(cost.wave_time([(12000, 1024)]))
    # short requests first: the cap is their chunks' time, each paying its fixed costs
    short = [req(i, 256 + 128, scheduled=256) for i in range(4)] + reqs
    assert planner.target_time(short) == pytest.approx(
        cost.wave_time([(256, 128)] * 4 + [(12000, 512)])
    )
    times, sizes, targets = [], [], []
    for _ in range(6):
        targets.append(planner.target_time(reqs))
        chunks = planner.plan(reqs)
        shapes = [(c.start, c.num_tokens) for c in chunks]
        times.append(cost.wave_time(shapes))
        sizes.append(shapes)
        for c in chunks:
            reqs[c.request_id].num_scheduled_tokens = c.end
    # every wave holds M tokens or comes within one block's cost of its target; none is above it
    block_cost = max(cost.chunk_time(L + x, 16) for shape in sizes for L, x in shape)
    full = [sum(x for _, x in shape) == 1024 for shape in sizes]
    assert all(f or T - block_cost <= t for t, T, f in zip(times, targets, full)), (times, targets)
    assert all(t <= T + 1e-12 for t, T in zip(times, targets)), (times, targets)
    # the first request comes first and fills the wave: M tokens, not fewer after its prefix
    assert sizes[0] == [(12000, 1024)]


def test_balanced_shrinks_chunks_after_long_prefixes():
    coef = CostCoefficients(c_wave=0.0, c0=0.0, g=0.0, b=1e-5, a=1e-8)
    cfg = PlannerConfig(block_size=16, num_stages=2, max_wave_tokens=8192, min_wave_tokens=16)
    planner = BalancedPlanner(cfg, CostModel(coef))
    cost = planner.cost
    budget = cost.chunk_time(0, 1024)
    x_far = cost.max_chunk_tokens(8000, budget)
    assert x_far < 1024
    assert cost.chunk_time(8000, x_far) <= budget < cost.chunk_time(8000, x_far + 1)


def test_cost_model_converges_to_exact_times():
    truth = CostCoefficients(c_wave=3e-3, c0=5e-4, g=2e-7, b=3e-4, a=4e-9)
    model = CostModel(CostCoefficients(c_wave=1e-3, c0=1e-3, g=1e-6, b=1e-3, a=1e-8))
    exact = CostModel(truth)
    import random

    rng = random.Random(0)
    for _ in range(400):
        chunks = [
            (rng.randrange(0, 8000, 16), rng.randrange(16, 1024)) for _ in range(rng.randint(1, 4))
        ]
        model.observe(chunks, exact.wave_time(chunks))
    for name in ("c_wave", "c0", "g", "b", "a"):
        assert getattr(model.coef, name) == pytest.approx(getattr(truth, name), rel=0.02), name


def test_cost_model_prior_rules_before_data():
    prior = CostCoefficients(c_wave=1e-3, c0=2e-4, g=1e-7, b=4e-4, a=1e-9)
    assert CostModel(prior).coef == prior


def test_unknown_planner_names_the_choices():
    with pytest.raises(ValueError, match="balanced"):
        make_planner("fastest", PlannerConfig())


def test_planner_config_validates_fields():
    with pytest.raises(ValueError, match="block_size"):
        PlannerConfig(block_size=0)
    with pytest.raises(ValueError, match="min_wave_tokens"):
        PlannerConfig(min_wave_tokens=4096, max_wave_tokens=1024)


def test_balanced_counts_the_work_in_flight():
    # linear cost: 1 ms per wave, 10 us per token; S = 2
    coef = CostCoefficients(c_wave=1e-3, c0=0.0, g=0.0, b=1e-5, a=0.0)
    cfg = PlannerConfig(block_size=16, num_stages=2, max_wave_tokens=8192, min_wave_tokens=16)
    planner = BalancedPlanner(cfg, CostModel(coef), overhead_frac=1e-9)
    a = req(0, 4096)
    # empty pipeline: the work spreads over S = 2 waves
    assert spans(planner.plan([a])) == [(0, 0, 2048, False)]
    a.num_scheduled_tokens = 2048
    a.state = RequestState.RUNNING
    assert planner.num_in_flight == 1
    # one wave of 2048 in flight: the next takes its equal share of all 4096, the whole rest,
    # not half of what waits (which would leave ever thinner waves)
    assert spans(planner.plan([a])) == [(0, 2048, 4096, True)]
    assert planner.num_in_flight == 2
    a.num_computed_tokens = 2048  # the first wave came back
    assert planner.num_in_flight == 1
    a.state = RequestState.DONE  # the second finished the request
    assert planner.num_in_flight == 0 and planner.in_flight_work() == 0.0


def test_filled_waves_double_behind_a_deep_queue():
    coef = CostCoefficients(c_wave=1e-3, c0=0.0, g=0.0, b=1e-5, a=0.0)
    cfg = PlannerConfig(
        block_size=16,
        num_stages=2,
        max_wave_tokens=256,
        min_wave_tokens=16,
        fill_waves=True,
        deep_queue_waves=2,
    )
    planner = BalancedPlanner(cfg, CostModel(coef))
    # 2 waves of 2M = 512 per stage, 2 stages: 2048 tokens waiting double the wave
    assert planner.wave_tokens([req(0, 2048)]) == 512
    assert planner.wave_tokens([req(0, 2032)]) == 256
    with pytest.raises(ValueError, match="hold_frac"):
        PlannerConfig(hold_frac=1.0)


def test_a_doubled_wave_never_outlasts_the_longest_so_far():
    # 1 ms per wave, 10 us per token, attention 1 ns per (2Lx + x^2); M = 256, S = 2
    coef = CostCoefficients(c_wave=1e-3, c0=0.0, g=0.0, b=1e-5, a=1e-9)
    cfg = PlannerConfig(
        block_size=16,
        num_stages=2,
        max_wave_tokens=256,
        min_wave_tokens=16,
        fill_waves=True,
        deep_queue_waves=2,
    )
    model = CostModel(coef)
    # an empty pipeline: 2M = 512 tokens from no prefix (6.4 ms) would outlast every wave so
    # far (none) and an M-token wave now (3.6 ms): through S stages the longest wave is paid
    # S - 1 more times, so the deep queue's wave holds M
    fresh = BalancedPlanner(cfg, model)
    assert fresh.wave_tokens([req(0, 4096)]) == 512
    assert spans(fresh.plan([req(0, 4096)])) == [(0, 0, 256, False)]
    # after a 256-token wave behind an 8,192-token prefix (1 + 2.56 + 4.26 = 7.8 ms) went out,
    # 512 tokens from no prefix (1 + 5.12 + 0.26 = 6.4 ms) fit under it
    seen = BalancedPlanner(cfg, CostModel(coef))
    long = req(1, 8192 + 256, scheduled=8192)
    # (requests in admission make its share the whole rest)
    assert spans(seen.plan([long], Admitting([(0, 4096)] * 4))) == [(1, 8192, 8448, True)]
    assert model.wave_time([(0, 512)]) < model.wave_time([(8192, 256)])
    short = req(0, 4096)
    assert spans(seen.plan([short])) == [(0, 0, 512, False)]
    # ... but not 512 tokens after a 4,096-token prefix (1 + 5.12 + 4.45 = 10.6 ms): the wave
    # is cut to the longest so far
    cut = req(2, 8192, scheduled=4096)
    (chunk,) = seen.plan([cut])
    assert 256 <= chunk.num_tokens < 512
    assert model.wave_time([(4096, chunk.num_tokens)]) <= model.wave_time([(8192, 256)]) + 1e-12
    # once the pipeline drains, the longest wave is forgotten: a new busy period
    for r in (long, short, cut):
        r.state = RequestState.DONE
    assert seen.num_in_flight == 0
    assert spans(seen.plan([req(3, 4096)])) == [(3, 0, 256, False)]


def test_balanced_counts_the_requests_in_admission():
    # linear cost: 1 ms per wave, 10 us per token; S = 4
    coef = CostCoefficients(c_wave=1e-3, c0=0.0, g=0.0, b=1e-5, a=0.0)
    cfg = PlannerConfig(block_size=16, num_stages=4, max_wave_tokens=4096, min_wave_tokens=16)
    alone = BalancedPlanner(cfg, CostModel(coef), overhead_frac=1e-9)
    # the first of a burst, alone: its 4096 tokens spread over S = 4 waves
    assert spans(alone.plan([req(0, 4096)])) == [(0, 0, 1024, False)]
    # the rest of the burst in the round: 3 x 4096 more to share, so the first wave takes the
    # whole first request (the share, 4096, is what it holds)
    beside = BalancedPlanner(cfg, CostModel(coef), overhead_frac=1e-9)
    assert spans(beside.plan([req(0, 4096)], Admitting([(0, 4096)] * 3))) == [(0, 0, 4096, True)]
    # a request whose round agreed a long cached prefix counts only its rest
    few = BalancedPlanner(cfg, CostModel(coef), overhead_frac=1e-9)
    assert spans(few.plan([req(0, 4096)], Admitting([(3584, 512)] * 3))) == [(0, 0, 1408, False)]


def test_filled_waves_fill_to_the_token_cap_across_chunks():
    # per chunk 1 ms plus re-reading its prefix (1 us per cached token): two chunks after a
    # 4096-token prefix cost more than one chunk of the same tokens
    coef = CostCoefficients(c_wave=1e-3, c0=1e-3, g=1e-6, b=1e-5, a=0.0)
    cfg = PlannerConfig(
        block_size=16,
        num_stages=2,
        max_wave_tokens=512,
        min_wave_tokens=16,
        fill_waves=True,
        deep_queue_waves=0,
    )
    planner = BalancedPlanner(cfg, CostModel(coef))
    a, b = req(0, 4096 + 256, scheduled=4096), req(1, 4096 + 512, scheduled=4096)
    many = [a, b] + [req(i, 4096 + 512, scheduled=4096) for i in range(2, 8)]
    # a time cap of one 512-token chunk after 4096 would cut b's chunk to 240 tokens and leave
    # every later wave out of step with request ends; the wave fills to M = 512 tokens instead
    assert spans(planner.plan(many)) == [(0, 4096, 4352, True), (1, 4096, 4352, False)]


def test_balanced_holds_a_thin_wave_for_a_round_about_to_end():
    # 1 ms per wave, 10 us per token; S = 4, one wave of 2,048 tokens in flight. A 256-token
    # request is ready (under half a share of all the work), another is in the running round:
    # sent apart, each pays the 1 ms wave cost
    coef = CostCoefficients(c_wave=1e-3, c0=0.0, g=0.0, b=1e-5, a=0.0)
    cfg = PlannerConfig(block_size=16, num_stages=4, max_wave_tokens=4096, min_wave_tokens=16)

    def planner_with_a_wave_in_flight():
        planner = BalancedPlanner(cfg, CostModel(coef), overhead_frac=1e-9)
        first = req(9, 8192)
        assert spans(planner.plan([first])) == [(9, 0, 2048, False)]
        first.num_scheduled_tokens, first.state = 2048, RequestState.RUNNING
        assert planner.num_in_flight == 1
        return planner

    ready = req(0, 256)
    # the round ends in 0.2 ms, under the 1 ms a wave of its own would cost: hold
    soon = Admitting([(0, 256), (0, 4096)], in_round=1, round_left_s=2e-4)
    assert planner_with_a_wave_in_flight().plan([ready], soon) == []
    # it ends in 2 ms, or its end is unknown (no round finished yet): send the thin wave
    for left in (2e-3, math.inf):
        late = Admitting([(0, 256)], in_round=1, round_left_s=left)
        assert spans(planner_with_a_wave_in_flight().plan([ready], late)) == [(0, 0, 256, True)]
    # waiting requests not yet in a round do not hold it (their round has not started)
    waiting = Admitting([(0, 256)], in_round=0, round_left_s=0.0)
    assert spans(planner_with_a_wave_in_flight().plan([ready], waiting)) == [(0, 0, 256, True)]
    # nothing in flight: never hold (no wave will come back to plan again)
    idle = BalancedPlanner(cfg, CostModel(coef), overhead_frac=1e-9)
    assert spans(idle.plan([ready], soon)) == [(0, 0, 256, True)]
    with pytest.raises(ValueError, match="in_round"):
        Admitting([(0, 1)], in_round=2)


def test_balanced_takes_a_short_rest_whole():
    # S = 2, 10 us per token: a ready request beside 900 tokens waiting for a round. 1,100 +
    # 900 share out to 1,000 per wave: the cut at 992 would leave 108 tokens (1/10 of it, under
    # tail_frac = 1/8) for a chunk of their own in a later wave, so the request goes whole
    coef = CostCoefficients(c_wave=1e-3, c0=0.0, g=0.0, b=1e-5, a=0.0)
    cfg = PlannerConfig(block_size=16, num_stages=2, max_wave_tokens=8192, min_wave_tokens=16)
    waiting = Admitting([(0, 900)])

    def first(num_tokens, **kwargs):
        planner = BalancedPlanner(cfg, CostModel(coef), overhead_frac=1e-9, **kwargs)
        return spans(planner.plan([req(0, num_tokens)], waiting))

    assert first(1100) == [(0, 0, 1100, True)]
    assert first(1100, tail_frac=0.0) == [(0, 0, 992, False)]
    # 1,300 + 900: the share is 1,100, the cut at 1,088 leaves 212 (over 1/8 of 1,300): cut
    assert first(1300) == [(0, 0, 1088, False)]
    # never past the token cap
    small = PlannerConfig(block_size=16, num_stages=2, max_wave_tokens=1024, min_wave_tokens=16)
    planner = BalancedPlanner(small, CostModel(coef), overhead_frac=1e-9)
    assert spans(planner.plan([req(0, 1100)], waiting))[0][2] <= 1024


def test_a_pipeline_filling_with_cold_prompts_sends_their_first_chunks_first():
    # filled waves of M = 256 tokens, S = 2, never holding
    coef = CostCoefficients(c_wave=1e-3, c0=0.0, g=0.0, b=1e-5, a=1e-9)
    cfg = PlannerConfig(
        block_size=16,
        num_stages=2,
        max_wave_tokens=256,
        min_wave_tokens=16,
        fill_waves=True,
        deep_queue_waves=0,
        hold_frac=0.0,
    )
    planner = BalancedPlanner(cfg, CostModel(coef))
    started, fresh = req(0, 1024), req(1, 1024)
    started.num_scheduled_tokens = 512  # two chunks sent, nothing cached
    # the pipeline is empty and every ready prompt is cold: the one with nothing sent yet
    # (attending over nothing) goes first, although the other came first
    assert spans(planner.plan([started, fresh])) == [(1, 0, 256, False)]
    fresh.num_scheduled_tokens, fresh.state = 256, RequestState.RUNNING
    # one wave in flight, still filling, nothing fresh left: FCFS
    assert spans(planner.plan([started, fresh])) == [(0, 512, 768, False)]
    started.num_scheduled_tokens, started.state = 768, RequestState.RUNNING
    # the pipeline is full (S waves in flight): FCFS again, a new cold prompt waits its turn
    late = req(2, 1024)
    assert planner.num_in_flight == 2
    assert spans(planner.plan([started, fresh, late])) == [(0, 768, 1024, True)]
    # a warm request ready (a cached prefix): FCFS while filling too, the cold prompt waits
    warm = BalancedPlanner(cfg, CostModel(coef))
    assert spans(warm.plan([req(0, 1024, scheduled=768), req(1, 1024)]))[0][:3] == (0, 768, 1024)
    # equal-time waves (the CPU runtime) keep FCFS
    fcfs = BalancedPlanner(
        PlannerConfig(
            block_size=16, num_stages=2, max_wave_tokens=256, min_wave_tokens=16, hold_frac=0.0
        ),
        CostModel(coef),
    )
    cold_started = req(0, 1024)
    cold_started.num_scheduled_tokens = 512
    assert spans(fcfs.plan([cold_started, req(1, 1024)]))[0][0] == 0
