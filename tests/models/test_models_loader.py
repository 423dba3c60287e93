"""The slice loader reads only its slice, from one file or from the shards that hold it, and
names what is wrong with a checkpoint."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import wavepp.models.loader as loader_module
from tests.models.conftest import hf_logits, random_prompt
from wavepp.models import CheckpointError, LocalPipeline, StageSpec, load_stage_model


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _shard_by_layer(src, dst):
    """Rewrite a checkpoint as one shard per layer, plus one for the embedding and one for the
    final norm / LM head, with model.safetensors.index.json."""
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in load_file(src / "model.safetensors").items():
        if name.startswith("model.layers."):
            shard = f"layer-{int(name.split('.')[2])}.safetensors"
        else:
            shard = "embed.safetensors" if "embed" in name else "head.safetensors"
        shards.setdefault(shard, {})[name] = tensor
    weight_map = {}
    for shard, tensors in shards.items():
        save_file(tensors, dst / shard)
        weight_map.update({name: shard for name in tensors})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return dst


def test_reads_only_the_slice(tiny_models, monkeypatch):
    read = []

    class Recording:
        def __init__(self, *args, **kwargs):
            self._inner = safe_open(*args, **kwargs)

        def __enter__(self):
            self._file = self._inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self._inner.__exit__(*exc)

        def keys(self):
            return self._file.keys()

        def get_slice(self, name):
            return self._file.get_slice(name)

        def get_tensor(self, name):
            read.append(name)
            return self._file.get_tensor(name)

    monkeypatch.setattr(loader_module, "safe_open", Recording)
    model = load_stage_model(tiny_models["qwen3"], StageSpec(1, 3, 4), torch.float32)
    assert model.embed is None and model.lm_head is None and len(model.layers) == 2
    assert {name.split(".")[2] for name in read} == {"1", "2"}
    assert len(read) == 2 * 11  # 9 weights + q_norm + k_norm per layer


def test_sharded_checkpoint_opens_only_needed_shards(tiny_models, tmp_path):
    sharded = _shard_by_layer(tiny_models["llama"], tmp_path / "sharded")
    # shards the last two stages never need are unreadable: loading them would fail
    for shard in ("embed.safetensors", "layer-0.safetensors", "layer-1.safetensors"):
        (sharded / shard).write_bytes(b"not a safetensors file")
    tail = load_stage_model(sharded, StageSpec(2, 4, 4), torch.float32)
    reference = load_stage_model(tiny_models["llama"], StageSpec(2, 4, 4), torch.float32)
    for (name, got), (_, want) in zip(tail.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(got, want), name
    with pytest.raises(CheckpointError, match="embed.safetensors: Error"):
        load_stage_model(sharded, StageSpec(0, 2, 4), torch.float32)


def test_sharded_checkpoint_matches_transformers(tiny_models, tmp_path):
    sharded = _shard_by_layer(tiny_models["qwen2"], tmp_path / "sharded")
    prompt = random_prompt(20, seed=12)
    logits = LocalPipeline(sharded, dtype=torch.float32, num_stages=2, num_blocks=8).prefill(
        "r", prompt
    )
    torch.testing.assert_close(
        logits, hf_logits(tiny_models["qwen2"], prompt)[-1], atol=1e-4, rtol=0
    )


def test_tied_lm_head_shares_the_embedding(tied_model):
    with safe_open(tied_model / "model.safetensors", framework="pt") as f:
        assert "lm_head.weight" not in f.keys()
    model = load_stage_model(tied_model, dtype=torch.float32)
    assert model.lm_head.data_ptr() == model.embed.data_ptr()


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        load_stage_model(tmp_path / "nowhere")


def test_missing_weights_file(tiny_models, tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    shutil.copy(tiny_models["llama"] / "config.json", path / "config.json")
    with pytest.raises(FileNotFoundError, match=f"no model.safetensors .* in {path}"):
        load_stage_model(path)


def test_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json does not exist"):
        load_stage_model(tmp_path)


def test_missing_shard_named(tiny_models, tmp_path):
    sharded = _shard_by_layer(tiny_models["llama"], tmp_path / "sharded")
    (sharded / "layer-3.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="layer-3.safetensors does not exist"):
        load_stage_model(sharded, StageSpec(3, 4, 4))


def test_corrupt_safetensors_named(tiny_models, tmp_path):
    path = _copy(tiny_models["llama"], tmp_path / "model")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_stage_model(path)
    (path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(
        CheckpointError, match=f"cannot read safetensors file {path}/model.safetensors"
    ):
        load_stage_model(path)


def _rewrite(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors")


def test_missing_tensor_named(tiny_models, tmp_path):
    path = _copy(tiny_models["llama"], tmp_path / "model")
    _rewrite(path, lambda t: t.pop("model.layers.2.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match="'model.layers.2.mlp.up_proj.weight' is missing"):
        load_stage_model(path)
    load_stage_model(path, StageSpec(0, 2, 4))  # a slice without layer 2 does not need it


def test_untied_model_needs_lm_head(tiny_models, tmp_path):
    path = _copy(tiny_models["llama"], tmp_path / "model")
    _rewrite(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match="'lm_head.weight' is missing"):
        load_stage_model(path, StageSpec(3, 4, 4))


def test_wrong_shape_named(tiny_models, tmp_path):
    path = _copy(tiny_models["qwen2"], tmp_path / "model")
    _rewrite(path, lambda t: t.update({"model.layers.1.self_attn.k_proj.bias": torch.zeros(31)}))
    with pytest.raises(
        CheckpointError,
        match=r"'model.layers.1.self_attn.k_proj.bias' .* shape \[31\]; expected \[32\]",
    ):
        load_stage_model(path)


def test_stage_for_another_model_and_bad_dtype(tiny_models):
    with pytest.raises(ValueError, match="the model at .* has 4"):
        load_stage_model(tiny_models["llama"], StageSpec(0, 3, 30))
    with pytest.raises(ValueError, match="dtype torch.float16 is not supported"):
        load_stage_model(tiny_models["llama"], dtype=torch.float16)
