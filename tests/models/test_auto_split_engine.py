"""layer_split="auto" on the real pipeline (Engine, one process per stage) at the layer
patterns of the released models: Kimi-Linear (27 layers, KDA with MLA at every fourth and the
last, layer 0 a dense MLP) and DeepSeek-V3 (61 layers, the first 3 dense, then MoE). The split
moves layers, not results: first tokens and logprobs as transformers computes them (fp32)."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_moe_families import reference_logits
from tests.prompts import two_prefix_prompts
from wavepp.engine import Engine
from wavepp.models import split_layers
from wavepp.random_checkpoint import make_model

VOCAB = 256
KIMI_FULL_ATTENTION = (3, 7, 11, 15, 19, 23, 26)  # Kimi-Linear-48B-A3B's MLA layers (0-based)


@pytest.fixture(scope="module")
def kimi_linear(tmp_path_factory):
    types = tuple(
        "full_attention" if i in KIMI_FULL_ATTENTION else "linear_attention" for i in range(27)
    )
    return make_model(
        tmp_path_factory.mktemp("kimi") / "kimi",
        arch="kimi_linear",
        num_layers=27,
        layer_types=types,
        seed=3,
    )


@pytest.fixture(scope="module")
def deepseek_v3(tmp_path_factory):
    # dense MLPs 40x the MoE's active width (4096 against 3 x 32): the dense layers cost more,
    # so auto moves layers off the stage that holds them
    return make_model(
        tmp_path_factory.mktemp("dsv3") / "dsv3",
        arch="deepseek_v3",
        num_layers=61,
        first_k_dense=3,
        intermediate_size=4096,
        seed=5,
    )


def _prompts(seed: int) -> list[list[int]]:
    return two_prefix_prompts(VOCAB, seed, per_prefix=2)


def _check_against_transformers(path, pp: int, **options) -> Engine:
    prompts = _prompts(seed=pp)
    reference = [reference_logits(path, p)[-1].log_softmax(-1) for p in prompts]
    with Engine(str(path), pp=pp, dtype="float32", block_size=4, **options) as engine:
        results = engine.prefill(prompts)
    for r, lp in zip(results, reference):
        assert r.ok, r.error
        assert r.first_token_id == int(lp.argmax())
        assert abs(r.first_token_logprob - float(lp.max())) < 1e-4
        top = torch.topk(lp, 3)
        assert [t for t, _ in r.top_logprobs[:3]] == top.indices.tolist()
        assert [v for _, v in r.top_logprobs[:3]] == pytest.approx(top.values.tolist(), abs=1e-4)
    assert sum(r.num_cached_tokens for r in results) > 0  # the shared prefixes were reused
    return engine


@pytest.mark.parametrize("pp", [2, 3])
def test_kimi_linear_auto_split_computes_transformers_first_tokens(kimi_linear, pp):
    engine = _check_against_transformers(
        kimi_linear, pp, layer_split="auto", snapshot_interval_blocks=2
    )
    split = engine.stage_split
    assert split.method == "auto" and split.costs.unit == "s"  # measured at start-up
    assert sum(split.sizes) == 27 and len(split.sizes) == pp and min(split.sizes) >= 1
    assert split.sizes == split.costs.balanced(pp)
    assert engine.runtime_config.layer_split == split.sizes  # what the stages were built with
    # the stages' blocks cost them differently (KDA snapshots, MLA rows), their counts do not
    assert len(set(engine.stage_num_blocks)) == 1
    assert engine.stage_num_blocks == engine.runtime_config.stage_blocks


def test_the_count_split_computes_transformers_first_tokens_too(kimi_linear, deepseek_v3):
    """The count split, which auto replaces where the layers differ, stays exact."""
    engine = _check_against_transformers(
        kimi_linear, 3, layer_split="even", snapshot_interval_blocks=2
    )
    assert engine.stage_split.method == "even" and engine.stage_split.sizes == (9, 9, 9)
    engine = _check_against_transformers(
        deepseek_v3, 2, layer_split="even", stage_num_blocks=[96] * 2, profile_waves=False
    )
    assert engine.stage_split.method == "even" and engine.stage_split.sizes == (31, 30)


@pytest.mark.parametrize("pp", [2, 3])
def test_deepseek_v3_default_split_is_auto_and_computes_transformers_first_tokens(deepseek_v3, pp):
    """Without the start-up profile auto balances the cost model's FLOPs, the same on every
    machine: the stage holding the costly dense layers takes fewer layers than the count split
    gives it (measured times, on a shared machine, could pick the count split itself)."""
    engine = _check_against_transformers(
        deepseek_v3, pp, stage_num_blocks=[96] * pp, profile_waves=False
    )
    split = engine.stage_split
    assert split.method == "auto" and split.costs.unit == "flop"  # the default: layers differ
    count_split = tuple(b - a for a, b in split_layers(61, pp))
    assert split.sizes[0] < count_split[0]
    assert max(split.shares) < max(split.costs.shares(count_split))
    assert engine.runtime_config.layer_split == split.sizes
