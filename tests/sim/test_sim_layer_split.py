"""The simulator's layer split: the runtime's balanced_split on its own cost model ("auto", the
default), or the count split ("even"); shown side by side; a pipeline runs faster with auto
where the layers differ."""

from __future__ import annotations

from dataclasses import replace

import pytest

from wavepp.models.spec import balanced_split, split_layers
from wavepp.sim import HARDWARE, MODELS, partition_layers
from wavepp.sim.cost.stages import compare_splits, layer_costs
from wavepp.sim.studies.scenario import SimSetup, run_setting
from wavepp.workloads.registry import make_workload


def sizes(bounds) -> tuple[int, ...]:
    return tuple(b - a for a, b in bounds)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("stages", [4, 8])
def test_auto_is_never_slower_than_even_on_the_cost_model(name, stages):
    m, hw = MODELS[name], HARDWARE["B300"]
    costs = layer_costs(m, hw)
    auto = partition_layers(m, hw, stages)
    even = partition_layers(m, hw, stages, "even")
    assert even == split_layers(m.num_layers, stages)
    assert sizes(auto) == balanced_split(costs.layers, stages, costs.fixed_costs(stages))
    assert max(costs.shares(sizes(auto))) <= max(costs.shares(sizes(even))) * (1 + 1e-9)
    assert costs.last > 0  # the LM head, counted on the last stage


def dense_heavy() -> object:
    """DeepSeek-V3 with its first 12 layers dense and 4x as wide as its real dense layers: a
    model whose layers differ enough that the count split leaves the first stages slowest."""
    m = MODELS["deepseek-v3"]
    return replace(
        m, name="dense-heavy", first_k_dense=12, intermediate_size=4 * m.intermediate_size
    )


def test_auto_moves_layers_off_costly_layers_and_the_pipeline_runs_faster():
    m, hw = dense_heavy(), HARDWARE["B300"]
    auto, even = partition_layers(m, hw, 4), partition_layers(m, hw, 4, "even")
    assert sizes(even) == (16, 15, 15, 15) and sizes(auto)[0] < 16
    lines = compare_splits(m, hw, 4)
    assert lines[0].startswith("dense-heavy on 4 x B300: layers per stage ")
    assert "(auto, simulator costs)" in lines[0] and "(even, simulator costs)" in lines[1]
    results = {}
    for split in ("auto", "even"):
        setup = SimSetup(m, hw, 4, token_scale=64, layer_split=split)
        w = make_workload("cold", num_requests=32, prompt_len=128, block_size=16, seed=0)
        results[split], _ = run_setting("wavepp", setup, w, 16)
        assert results[split].num_failed == 0
    assert results["auto"].input_tok_s > 1.05 * results["even"].input_tok_s


def test_a_setup_takes_auto_or_even_only():
    with pytest.raises(ValueError, match="layer_split must be 'auto' or 'even'"):
        SimSetup(MODELS["glm-5"], HARDWARE["B300"], 4, layer_split="balanced")
    with pytest.raises(ValueError, match="must be 'auto' or 'even'"):
        partition_layers(MODELS["glm-5"], HARDWARE["B300"], 4, "count")
