"""Loading the MoE / MLA / DSA families: parsed configs, stage slices that read only their own
tensors, page layouts, and bad checkpoints refused at load naming the file and tensor."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from wavepp.cli import main
from wavepp.models import (
    CheckpointError,
    StageSpec,
    load_model_config,
    load_stage_model,
    page_layout,
    stage_specs,
)
from wavepp.runtime.stage_blocks import blocks_within


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_configs_parse_each_family(moe_models):
    mm = load_model_config(moe_models["minimax_m2"])
    assert (
        mm.model_type,
        mm.num_kv_heads,
        mm.head_dim,
        mm.rotary_dim,
        mm.num_experts,
        mm.num_shared_experts,
        mm.dense_layers,
    ) == ("minimax_m2", 2, 16, 8, 8, 0, ())
    ds = load_model_config(moe_models["deepseek_v3"])
    assert (
        ds.is_mla,
        ds.kv_lora_rank,
        ds.qk_rope_head_dim,
        ds.dense_layers,
        ds.n_group,
        ds.topk_group,
        ds.routed_scaling_factor,
        ds.rope_interleave,
        ds.has_indexer,
    ) == (True, 16, 8, (0,), 2, 1, 2.5, True, False)
    glm = load_model_config(moe_models["glm_moe_dsa/topk4"])
    assert (glm.index_topk, glm.index_n_heads, glm.index_head_dim) == (4, 2, 16)
    assert [glm.runs_indexer(i) for i in range(4)] == [True, True, False, True]
    assert [glm.reuses_topk(i) for i in range(5)] == [False, False, True, False, False]
    qm = load_model_config(moe_models["qwen3_moe"])
    assert (
        qm.model_type,
        qm.num_kv_heads,
        qm.head_dim,
        qm.dense_layers,
        qm.num_experts,
        qm.norm_topk_prob,
    ) == ("qwen3_moe", 2, 16, (0,), 8, True)
    assert [layer.mlp.kind for layer in qm.layers] == ["dense", "moe", "moe", "moe"]
    assert {layer.attention.qk_norm for layer in qm.layers} == {"head"}


def test_qwen3_moe_dense_layers_follow_mlp_only_layers_and_the_sparse_step():
    from wavepp.models import parse_config

    base = {
        "model_type": "qwen3_moe",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    }
    assert parse_config({**base, "mlp_only_layers": [1, 4]}).dense_layers == (1, 4)
    assert parse_config({**base, "decoder_sparse_step": 2}).dense_layers == (0, 2, 4)
    assert parse_config(base).dense_layers == ()
    with pytest.raises(ValueError, match="sliding-window"):
        parse_config({**base, "use_sliding_window": True})


def test_page_layouts_size_pools_from_a_budget(moe_models):
    """Bytes per token and layer: GQA K + V; MLA one latent row (16 + 8); DSA adds indexer keys
    (16) on the layers that run an indexer."""
    layouts = {arch: page_layout(load_model_config(moe_models[arch])) for arch in moe_models}
    assert [p.name for p in layouts["minimax_m2"].pools] == ["key", "value"]
    assert layouts["minimax_m2"].bytes_per_token(0, 2) == 2 * 2 * 16 * 2
    assert [p.name for p in layouts["deepseek_v3"].pools] == ["latent"]
    assert layouts["deepseek_v3"].bytes_per_token(3, 4) == (16 + 8) * 4
    glm = layouts["glm_moe_dsa"]
    assert [glm.bytes_per_token(i, 4) for i in range(4)] == [160, 160, 96, 160]
    # stage [2, 4) in fp32, blocks of 4: (96 + 160) * 4 = 1024 bytes a block
    assert glm.bytes_per_block(2, 4, 4, 4) == 1024
    assert blocks_within(10 * 1024 + 1023, glm.bytes_per_block(2, 4, 4, 4), 0, 1) == 10
    stage = load_stage_model(moe_models["glm_moe_dsa"], StageSpec(2, 4, 4), torch.float32)
    assert stage.new_kv_cache(10, 4).num_bytes == 10 * 1024


def test_each_stage_reads_only_its_tensors(moe_models, tmp_path):
    """A broken layer-3 expert does not stop the stage owning layers [0, 2) from loading."""
    path = _copy(moe_models["deepseek_v3"], tmp_path / "ds")
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.3.mlp.experts.5.down_proj.weight"
    tensors[name] = torch.zeros(7, 7)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    first = load_stage_model(path, StageSpec(0, 2, 4), torch.float32)
    assert first.embed is not None and first.lm_head is None
    with pytest.raises(
        CheckpointError,
        match=rf"tensor '{name}' in .*model.safetensors has shape "
        rf"\[7, 7\]; expected \[64, 32\]",
    ):
        load_stage_model(path, StageSpec(2, 4, 4), torch.float32)


def test_missing_indexer_tensor_is_named(moe_models, tmp_path):
    path = _copy(moe_models["glm_moe_dsa"], tmp_path / "glm")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.3.self_attn.indexer.wk.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'model.layers.3.self_attn.indexer.wk.weight' "
        r"is missing from the checkpoint at .*glm",
    ):
        load_stage_model(path, stage_specs(4, 2)[1], torch.float32)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]},
            r"model_type 'mixtral'\) is not supported",
        ),
        (
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
            "rope_type 'longrope' is not supported",
        ),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"n_group": 3}, "must split into n_group=3 groups"),
        (
            {"quantization_config": {"quant_method": "fp8"}},
            r"quantized checkpoints \(fp8\) are not supported",
        ),
    ],
)
def test_unsupported_configs_fail_naming_the_file(moe_models, tmp_path, change, message):
    path = _copy(moe_models["deepseek_v3"], tmp_path / "ds")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=r"config\.json: .*" + message):
        load_stage_model(path, dtype=torch.float32)


@pytest.mark.parametrize("arch", ["minimax_m2", "deepseek_v3", "glm_moe_dsa", "qwen3_moe"])
def test_make_model_command_writes_a_loadable_checkpoint(tmp_path, capsys, arch):
    assert main(["make-model", str(tmp_path / arch), "--arch", arch, "--layers", "3"]) == 0
    assert f"wrote {arch} (3 layers" in capsys.readouterr().out
    config = load_model_config(tmp_path / arch)
    assert (config.model_type, config.num_layers) == (arch, 3)
    assert len(load_stage_model(tmp_path / arch, dtype=torch.float32).layers) == 3


def test_make_model_set_reaches_the_spec_fields_that_have_no_flag():
    from wavepp.cli.make_model import spec_overrides

    assert spec_overrides(
        ["head_dim=128", "rope_theta=5e5", "indexer_types=full,shared", "q_lora_rank=0"]
    ) == {
        "head_dim": 128,
        "rope_theta": 500000.0,
        "indexer_types": ("full", "shared"),
        "q_lora_rank": 0,
    }
    with pytest.raises(ValueError, match="FIELD one of .*kv_lora_rank"):
        spec_overrides(["bogus=1"])
    with pytest.raises(ValueError, match="flags of their own"):
        spec_overrides(["num_layers=3"])
    with pytest.raises(ValueError, match="not a value of num_experts"):
        spec_overrides(["num_experts=many"])
