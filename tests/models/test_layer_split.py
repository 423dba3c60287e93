"""balanced_split: the contiguous split whose slowest stage is the fastest, checked against
every contiguous split on small cases; its tie-break; its errors; the split records."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wavepp.models.spec import split_layers
from wavepp.models.spec.layer_split import LayerCosts, StageSplit, balanced_split, stage_costs


def all_splits(num_layers: int, num_stages: int):
    for cuts in itertools.combinations(range(1, num_layers), num_stages - 1):
        bounds = (0, *cuts, num_layers)
        yield tuple(b - a for a, b in zip(bounds, bounds[1:]))


def brute_force(costs, num_stages, fixed=()):
    """The split the tie-break names: the smallest slowest stage, then the smallest sum of
    squared stage costs, then the lexicographically largest counts."""

    def key(sizes):
        c = stage_costs(costs, sizes, fixed)
        return (max(c), sum(x * x for x in c), tuple(-n for n in sizes))

    return min(all_splits(len(costs), num_stages), key=key)


@st.composite
def cases(draw, max_layers=9):
    n = draw(st.integers(1, max_layers))
    stages = draw(st.integers(1, n))
    costs = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    fixed = draw(
        st.one_of(st.just(()), st.lists(st.integers(0, 30), min_size=stages, max_size=stages))
    )
    return costs, stages, tuple(fixed)


@settings(max_examples=400, deadline=None)
@given(cases())
def test_the_split_is_the_brute_forces_best(case):
    """Integer costs: the sums are exact, so the whole tie-break is checked, not only the max."""
    costs, stages, fixed = case
    sizes = balanced_split(costs, stages, fixed)
    assert sizes == brute_force(costs, stages, fixed)
    assert len(sizes) == stages and min(sizes) >= 1 and sum(sizes) == len(costs)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=8).flatmap(
        lambda c: st.tuples(st.just(c), st.integers(1, len(c)))
    )
)
def test_float_costs_reach_the_smallest_slowest_stage(case):
    costs, stages = case
    sizes = balanced_split(costs, stages)
    best = min(max(stage_costs(costs, s)) for s in all_splits(len(costs), stages))
    assert max(stage_costs(costs, sizes)) <= best * (1 + 1e-9) + 1e-12
    assert balanced_split(list(costs), stages) == sizes  # deterministic


@pytest.mark.parametrize("cost", [1.0, 0.1, 1 / 3, 7e-4])
def test_equal_costs_give_the_count_split(cost):
    """Sums of 0.1 differ in their last bits by order; the split must not follow them."""
    for n in range(1, 30):
        for stages in range(1, min(n, 8) + 1):
            counts = tuple(end - start for start, end in split_layers(n, stages))
            assert balanced_split([cost] * n, stages) == counts


def test_cheap_layers_go_where_they_balance_the_pipeline():
    # DeepSeek-V3's pattern: 3 dense layers (cost 1), then MoE layers (cost 3); the head on the
    # last stage costs 2. Count split of 9 layers in 3: 3,3,3 -> 3, 9, 11; balanced: 5,2,2 ->
    # 9, 6, 8 (or better)
    costs = [1, 1, 1] + [3] * 6
    fixed = (0, 0, 2)
    sizes = balanced_split(costs, 3, fixed)
    assert sizes == (5, 2, 2)
    assert stage_costs(costs, sizes, fixed) == (9, 6, 8)
    assert max(stage_costs(costs, (3, 3, 3), fixed)) == 11


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="cannot split 3 layers into 4 stages"):
        balanced_split([1, 1, 1], 4)
    with pytest.raises(ValueError, match="cannot split 3 layers into 0 stages"):
        balanced_split([1, 1, 1], 0)
    with pytest.raises(ValueError, match="fixed_costs has 1 entries for 2 stages"):
        balanced_split([1, 1, 1], 2, [1])
    with pytest.raises(ValueError, match="finite and >= 0"):
        balanced_split([1, -1, 1], 2)
    with pytest.raises(ValueError, match="finite and >= 0"):
        balanced_split([1, float("nan"), 1], 2)
    with pytest.raises(ValueError, match="at least one layer and sum to the 3 layers"):
        stage_costs([1, 1, 1], (3, 0))


def test_layer_costs_count_the_embedding_and_the_head_where_they_run():
    costs = LayerCosts((1.0, 1.0, 1.0, 1.0), first=0.5, last=1.5)
    assert costs.fixed_costs(1) == (2.0,)
    assert costs.fixed_costs(3) == (0.5, 0.0, 1.5)
    assert costs.balanced(2) == (3, 1)  # 3.5 | 2.5, not 2.5 | 3.5
    split = StageSplit((3, 1), "auto", costs)
    assert split.shares == pytest.approx((3.5 / 6, 2.5 / 6))
    assert split.imbalance == pytest.approx(7 / 6)
    assert split.describe() == (
        "layers per stage 3,1 (auto, measured costs): predicted shares 58.3% 41.7%, "
        "slowest 1.17x the mean"
    )
    with pytest.raises(ValueError, match="unit must be 's' or 'flop'"):
        LayerCosts((1.0,), unit="ms")
    with pytest.raises(ValueError, match="finite costs >= 0"):
        LayerCosts((1.0,), last=-1.0)
