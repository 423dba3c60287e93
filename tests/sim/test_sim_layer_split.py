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


def test_packed_waves_cut_each_prompts_new_tokens_into_full_waves_in_order():
    from wavepp.sim.cost.stages import packed_waves

    waves = packed_waves([(10, 4), (5, 0), (3, 2)], 4)
    assert waves == (((4, 4),), ((8, 2), (0, 2)), ((2, 3), (2, 1)))
    assert sum(n for w in waves for _, n in w) == 6 + 5 + 1  # every new token once
    with pytest.raises(ValueError, match="with 5 cached"):
        packed_waves([(5, 5)], 4)


def test_long_prompts_move_layers_off_the_stage_that_holds_the_attention_layers():
    """Kimi K3 at 128K tokens a prompt: an MLA layer costs far more than a KDA layer there (at
    the 8K reference wave about the same), so balancing on the workload's own waves gives the
    last stages fewer layers and a slowest stage close to the mean, where the count split is
    over 10% off; the pipeline runs faster for it."""
    from wavepp.sim.studies.scenario import balanced_on

    m, hw = MODELS["kimi-k3"], HARDWARE["GB300"]
    setup = SimSetup(m, hw, 8, token_scale=256, max_wave_tokens=16384)
    cold = make_workload("cold", num_requests=16, prompt_len=512, block_size=16, seed=0)
    waves = balanced_on(setup, cold).balance_waves
    assert sum(n for w in waves for _, n in w) == 16 * 512 * 256
    assert max(n for w in waves for _, n in w) <= 16384
    costs = layer_costs(m, hw, waves)
    auto, even = sizes(partition_layers(m, hw, 8, "auto", waves)), sizes(split_layers(61, 8))
    assert max(costs.shares(even)) * 8 > 1.10
    assert max(costs.shares(auto)) * 8 < 1.05
    assert sizes(partition_layers(m, hw, 8)) == even  # the 8K reference wave: the count split
    # the same prompts mostly reused: another set of waves (after the cached prefix)
    reuse = make_workload("reuse", num_requests=16, prompt_len=512, block_size=16, seed=0)
    assert balanced_on(setup, reuse).balance_waves != waves
    # waves given in the setup are kept
    given = replace(setup, balance_waves=(((0, 8192),),))
    assert balanced_on(given, cold) is given
    results = {}
    for split in ("auto", "even"):
        r, _ = run_setting("wavepp", replace(setup, layer_split=split), cold, 8)
        results[split] = r.input_tok_s
    assert results["auto"] > 1.05 * results["even"]
