"""The layer split an engine runs (runtime/stage_split.py), chosen before any process starts:
given, even, auto (measured, or the cost model's), and the default by the model's layers; the
option's checks in EngineConfig and on the command line."""

from __future__ import annotations

import argparse

import pytest

from wavepp.cli.args import add_stage_args, layer_split
from wavepp.engine_config import EngineConfig
from wavepp.models import load_model_config, split_layers
from wavepp.models.spec.layer_cost import modeled_costs, reference_chunks
from wavepp.random_checkpoint import make_model
from wavepp.runtime.layer_timing import kind_representatives
from wavepp.runtime.stage_split import choose_stage_split, layers_differ


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("llama") / "llama", arch="llama", num_layers=4)


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    # DeepSeek-V3's pattern, shortened: 3 dense layers, then MoE; the dense MLPs 40x the MoE's
    # active width (4096 against 3 x 32)
    return make_model(
        tmp_path_factory.mktemp("dsv3") / "dsv3",
        arch="deepseek_v3",
        num_layers=9,
        first_k_dense=3,
        intermediate_size=4096,
    )


def choose(path, **options):
    return choose_stage_split(
        EngineConfig(str(path), **options), load_model_config(path), str(path), "cpu"
    )


def count_split(n: int, pp: int) -> tuple[int, ...]:
    return tuple(end - start for start, end in split_layers(n, pp))


def test_auto_on_a_uniform_llama_is_the_count_split_and_the_default_measures_nothing(llama):
    auto = choose(llama, pp=2, layer_split="auto")
    assert auto.method == "auto" and auto.costs.unit == "s"
    assert auto.sizes == (2, 2) == count_split(4, 2)
    assert len(set(auto.costs.layers)) == 1  # one kind: timed once, the same for every layer
    default = choose(llama, pp=3)
    assert default.method == "even" and default.sizes == (2, 1, 1)
    assert default.costs.unit == "flop"  # its shares come from the cost model
    assert not layers_differ(load_model_config(llama))


def test_auto_moves_layers_off_the_stage_of_the_costly_dense_layers(deepseek):
    """The cost model's split (no start-up measuring) is exact: the dense layers' FLOPs move
    layers off the first stage. The measured one is the default; what it picks depends on the
    machine's timings (and on its load: this one is shared), so only its form is checked."""
    spec = load_model_config(deepseek)
    assert layers_differ(spec)
    for pp, expected in ((2, (2, 7)), (3, (1, 1, 7))):
        modeled = choose(deepseek, pp=pp, profile_waves=False)
        assert modeled.method == "auto" and modeled.costs == modeled_costs(spec)
        assert modeled.sizes == expected != count_split(9, pp)
        assert max(modeled.shares) < max(modeled.costs.shares(count_split(9, pp)))
        measured = choose(deepseek, pp=pp)  # the default on a model whose layers differ
        assert measured.method == "auto" and measured.costs.unit == "s"
        dense, moe = measured.costs.layers[:3], measured.costs.layers[3:]
        assert len(set(dense)) == 1 and len(set(moe)) == 1  # each kind timed once
        assert measured.sizes == measured.costs.balanced(pp)
    # a shared KV tier: the same split on every replica, from the cost model
    tier = EngineConfig(str(deepseek), pp=2, kv_tier="mooncake-store", kv_tier_master="h:1")
    assert choose_stage_split(tier, spec, str(deepseek), "cpu").costs.unit == "flop"


def test_given_and_even_splits_are_kept_with_their_predicted_shares(deepseek):
    given = choose(deepseek, pp=2, layer_split=[2, 7])
    assert given.method == "given" and given.sizes == (2, 7)
    assert sum(given.shares) == pytest.approx(1.0)
    assert given.shares == given.costs.shares((2, 7)) and given.costs.unit == "flop"
    even = choose(deepseek, pp=3, layer_split="even")
    assert even.method == "even" and even.sizes == (3, 3, 3)
    assert "layers per stage 3,3,3 (even, cost model costs): predicted shares" in even.describe()


def test_a_split_that_does_not_fit_the_model_is_refused_before_anything_is_measured(deepseek):
    with pytest.raises(ValueError, match="sum to the model's 9 layers"):
        choose(deepseek, pp=2, layer_split=[2, 2])
    with pytest.raises(ValueError, match="cannot split 9 layers into 10 stages"):
        choose(deepseek, pp=10, layer_split="auto")


def test_the_option_is_checked_where_it_is_built():
    assert EngineConfig(pp=2, layer_split="auto").layer_split == "auto"
    assert EngineConfig(pp=2, layer_split=[3, 4]).layer_split == (3, 4)
    assert EngineConfig(pp=2).layer_split == ()
    with pytest.raises(ValueError, match="layer_split must be 'auto', 'even' or one layer count"):
        EngineConfig(pp=2, layer_split="balanced")
    with pytest.raises(ValueError, match=r"layer_split \[3\] needs one positive layer count"):
        EngineConfig(pp=2, layer_split=[3])
    with pytest.raises(ValueError, match="needs one positive layer count per stage"):
        EngineConfig(pp=2, layer_split=["auto", 3])


def test_the_command_line_takes_auto_even_or_counts():
    assert layer_split("auto") == "auto" and layer_split(" even ") == "even"
    assert layer_split("14, 16") == [14, 16] and layer_split(None) is None
    for bad in ("auto,3", "3,auto", "fast"):
        with pytest.raises(ValueError, match="--layer-split takes auto, even, or layer counts"):
            layer_split(bad)
    parser = argparse.ArgumentParser()
    add_stage_args(parser)
    assert parser.parse_args(["--layer-split", "auto"]).layer_split == "auto"


def test_each_kind_of_layer_is_timed_once_away_from_the_embedding_and_the_head(deepseek):
    spec = load_model_config(deepseek)
    kinds = kind_representatives(spec)
    assert sorted(kinds.values()) == [1, 3]  # dense: layer 1 (not 0); MoE: layer 3
    assert reference_chunks(8192, 16) == ((0, 512), (512, 512))
    assert reference_chunks(512, 16) == ((0, 256), (256, 256))
    assert reference_chunks(100, 16) == ((0, 32), (32, 32))
