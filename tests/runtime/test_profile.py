"""The start-up profiling pass: which waves it times, what the planner starts from, and that it
leaves nothing behind."""

import random

import pytest

from wavepp.engine import Engine
from wavepp.runtime.profile import fit_profile, profile_shapes
from wavepp.sched.cost_model import CostCoefficients, CostModel

from .helpers import MAX_POSITIONS, VOCAB, assert_clean


def test_shapes_separate_the_terms_and_fit_the_pipeline():
    shapes = profile_shapes(16, 8192, 100_000)
    assert len(shapes) == 18
    assert {len(s) for s in shapes} == {1, 4}  # one chunk and four
    assert {s[0][0] for s in shapes} == {0, 512, 2048}  # no prefix, M and 4M
    assert {sum(x for _, x in s) for s in shapes if len(s) == 1} == {512, 128, 32}
    # a small model or pool: the largest wave shrinks until every wave fits
    for positions, blocks in ((512, 4096), (1024, 200), (400, 10_000)):
        small = profile_shapes(16, positions, blocks)
        assert small, (positions, blocks)
        for s in small:
            assert all(L + x <= positions for L, x in s)
            assert sum(-(-(L + x) // 16) for L, x in s) <= blocks
            assert all(x % 16 == 0 and L % 16 == 0 for L, x in s)
    assert profile_shapes(16, 100, 10_000) == ()  # under four blocks: no pass


def test_fit_follows_the_slowest_stage():
    true = [
        CostCoefficients(c_wave=3e-3, c0=5e-4, g=2e-7, b=1e-4, a=3e-9),
        CostCoefficients(c_wave=1e-3, c0=2e-4, g=1e-6, b=2e-4, a=1e-9),
    ]
    shapes = profile_shapes(16, 8192, 100_000)
    times = [[CostModel(c).wave_time(s) for s in shapes] for c in true]
    prof = fit_profile(shapes, times)
    slowest = [max(a, b) for a, b in zip(*times)]
    assert prof.slowest == slowest
    fitted = CostModel(prof.coefficients)
    errors = [abs(fitted.wave_time(s) - t) / t for s, t in zip(shapes, slowest)]
    # the max of two linear models is not linear: the fit is close, not exact
    assert max(errors) < 0.15
    # one stage alone: its coefficients come back exactly
    exact = fit_profile(shapes, [times[0]]).coefficients
    for name in ("c_wave", "c0", "b", "a"):
        assert getattr(exact, name) == pytest.approx(getattr(true[0], name), rel=1e-6), name
    with pytest.raises(ValueError):
        fit_profile(shapes, [times[0][:-1]])


@pytest.mark.parametrize("pp", [2, 3])
def test_engine_starts_its_planner_from_the_pass(big_tiny, pp):
    rng = random.Random(pp)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(20, 300))] for _ in range(6)]
    with Engine(str(big_tiny), pp=pp, dtype="float32") as engine:
        prof = engine.profile
        assert prof is not None and len(prof.shapes) == 18
        assert len(prof.stage_seconds) == pp
        assert all(t > 0 for per_stage in prof.stage_seconds for t in per_stage)
        assert engine._core.leader.planner.cost.coef == prof.coefficients
        # the pass left every cache empty: nothing used, leased or live
        for cap, live in engine.check_integrity():
            assert cap.num_evictable == cap.num_leased == cap.num_escrowed == cap.num_in_use == 0
            assert live == 0
        got = engine.prefill(prompts)
        assert_clean(engine)
        # a reset keeps the fitted start
        engine.reset("lockstep")
        assert engine._core.leader.planner.cost.coef == prof.coefficients
    with Engine(str(big_tiny), pp=pp, dtype="float32", profile_waves=False) as engine:
        assert engine.profile is None
        assert engine._core.leader.planner.cost.coef == CostCoefficients()
        want = engine.prefill(prompts)
    for a, b in zip(got, want):
        assert a.first_token_id == b.first_token_id
        assert a.first_token_logprob == pytest.approx(b.first_token_logprob, abs=1e-4)


def test_static_policy_and_small_pools_start_without_a_fit(tiny):
    # a pool too small for the pass: no fit, the default start, requests still served
    with Engine(str(tiny), pp=2, dtype="float32", stage_num_blocks=[40, 40]) as engine:
        assert engine.profile is None
        assert engine.prefill([[1, 2, 3, 4, 5]])[0].error is None
    assert MAX_POSITIONS < 5 * 512  # the tiny model: the pass shrinks to fit it


def test_no_profile_waves_on_the_command_line_skips_the_pass():
    import argparse

    from wavepp.cli.args import add_engine_args, add_pipeline_args, engine_config

    p = argparse.ArgumentParser()
    add_pipeline_args(p)
    add_engine_args(p)
    p.add_argument("--top-k", type=int, default=5)
    assert engine_config(p.parse_args([]), "m").profile_waves is True
    assert engine_config(p.parse_args(["--no-profile-waves"]), "m").profile_waves is False
