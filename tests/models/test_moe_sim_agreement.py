"""The simulator reads the same shapes the runtime computes with: for each tiny MoE / MLA /
DSA checkpoint, the simulator's parameter count equals the runtime's parameters, and its
cache bytes per token and layer equal the runtime's page layout."""

from __future__ import annotations

import json

import pytest
import torch

from wavepp.models import load_model_config, load_stage_model, page_layout
from wavepp.sim.cost.model_shapes import ModelShape


@pytest.mark.parametrize("arch", ["minimax_m2", "deepseek_v3", "glm_moe_dsa", "qwen3_moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_simulator_counts_what_the_runtime_holds(moe_models, arch, dtype):
    path = moe_models[arch]
    shape = ModelShape.from_hf(
        json.loads((path / "config.json").read_text()), kv_bytes=dtype.itemsize
    )
    model = load_stage_model(path, dtype=dtype)
    assert shape.num_params() == sum(p.numel() for p in model.parameters())
    layout = page_layout(load_model_config(path))
    per_layer = [layout.bytes_per_token(i, dtype.itemsize) for i in range(shape.num_layers)]
    assert [shape.kv_bytes_per_token(i) for i in range(shape.num_layers)] == per_layer
    assert model.new_kv_cache(3, 4).num_bytes == 3 * 4 * sum(per_layer)


@pytest.fixture(scope="module")
def kimi_linear(tmp_path_factory):
    """KDA, KDA, MLA, KDA (the first layer dense): every kind of layer the simulator counts."""
    from wavepp.random_checkpoint import make_model

    return make_model(
        tmp_path_factory.mktemp("kimi") / "kimi", arch="kimi_linear", num_layers=4, seed=3
    )


def test_simulator_counts_kimi_linear_as_transformers_does(kimi_linear):
    """Every weight of transformers' kimi_linear module: the KDA layers' convolutions, decay
    (dt_bias, A_log) and output norms too. transformers keeps the router's score-correction
    bias as a buffer; the runtime loads it as a parameter, and the simulator counts it."""
    import transformers

    hf = json.loads((kimi_linear / "config.json").read_text())
    shape = ModelShape.from_hf(hf, kv_bytes=4)
    reference = transformers.AutoModelForCausalLM.from_pretrained(kimi_linear, dtype=torch.float32)
    bias = sum(
        b.numel()
        for name, b in reference.named_buffers()
        if name.endswith("e_score_correction_bias")
    )
    assert bias == hf["num_experts"] * sum(t != "dense" for t in hf["mlp_layer_types"])
    assert shape.num_params() == sum(p.numel() for p in reference.parameters()) + bias
    runtime = load_stage_model(kimi_linear, dtype=torch.float32)
    assert shape.num_params() == sum(p.numel() for p in runtime.parameters())
