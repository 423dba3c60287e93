"""Load one stage's slice of an HF checkpoint: only the tensors that slice needs are read.

Reads `model.safetensors`, or a sharded checkpoint through `model.safetensors.index.json`
(then only the shards that hold the slice's tensors are opened). HF tensor names map onto the
stage's modules, with q/k/v and gate/up concatenated into single projections:

    model.embed_tokens.weight                      -> embed                (first stage)
    model.layers.{start + j}.self_attn.{q,k,v}_proj -> layers.{j}.attn.qkv_proj (+ qkv_bias)
    model.layers.{start + j}.mlp.{gate,up}_proj     -> layers.{j}.mlp.gate_up_proj
    model.norm.weight, lm_head.weight              -> norm, lm_head         (last stage)

With tie_word_embeddings and no lm_head.weight in the checkpoint, the LM head is the embedding.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

from wavepp.models.config import ModelConfig, StageSpec, load_model_config
from wavepp.models.moe_config import MoEModelConfig
from wavepp.models.stage_model import StageModel

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_EMBED, _LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


class CheckpointError(ValueError):
    """A checkpoint file is unreadable, or lacks or mis-shapes a tensor the stage needs."""


def load_stage_model(model_path: str | Path, stage: StageSpec | None = None,
                     dtype: torch.dtype = torch.bfloat16) -> StageModel:
    """Build the stage slice `stage` (default: the whole model) from the HF checkpoint at
    `model_path`, in `dtype` (torch.bfloat16 or torch.float32).

    Raises FileNotFoundError naming a missing directory or file, CheckpointError naming an
    unreadable file or a missing / wrongly shaped tensor, ValueError for an unsupported config
    or a layer range outside the model.
    """
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {dtype} is not supported; use torch.bfloat16 or torch.float32")
    config = load_model_config(model_path)
    stage = stage or StageSpec.whole(config.num_layers)
    if stage.num_layers != config.num_layers:
        raise ValueError(f"stage layer range [{stage.start_layer}, {stage.end_layer}) was made for "
                         f"{stage.num_layers} layers; the model at {model_path} has {config.num_layers}")
    if isinstance(config, MoEModelConfig):
        from wavepp.models.moe_loader import load_moe_stage_model   # it builds on this module
        return load_moe_stage_model(model_path, config, stage, dtype)
    shapes = stage_tensor_shapes(config, stage)
    tensors = read_tensors(model_path, shapes, dtype,
                           aliases={_LM_HEAD: _EMBED} if config.tie_word_embeddings else {})
    model = StageModel(config, stage, dtype)
    model.load_state_dict(_module_state(config, stage, tensors), strict=True, assign=True)
    return model.eval()


def stage_tensor_shapes(config: ModelConfig, stage: StageSpec) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> expected shape, for every tensor the slice `stage` reads."""
    hidden, inter, q, kv = config.hidden_size, config.intermediate_size, config.q_size, config.kv_size
    shapes: dict[str, tuple[int, ...]] = {}
    if stage.is_first:
        shapes[_EMBED] = (config.vocab_size, hidden)
    for layer in range(stage.start_layer, stage.end_layer):
        p = f"model.layers.{layer}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, q),
            p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        })
        if config.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if config.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (hidden,)
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (config.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (config.head_dim,)
    if stage.is_last:
        shapes["model.norm.weight"] = (hidden,)
        shapes[_LM_HEAD] = (config.vocab_size, hidden)
    return shapes


def read_tensors(model_path: str | Path, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype,
                 aliases: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Read exactly the tensors named in `shapes` (checking each shape) as `dtype`.

    A name absent from the checkpoint is read under `aliases[name]` if given (tied weights).
    Only the files holding the requested tensors are opened.
    """
    path = Path(model_path)
    weight_map = _weight_map(path)
    aliases = aliases or {}
    by_file: dict[Path, list[tuple[str, str]]] = defaultdict(list)
    for name in shapes:
        stored = name if name in weight_map or name not in aliases else aliases[name]
        if stored not in weight_map:
            raise CheckpointError(f"tensor {name!r} is missing from the checkpoint at {path}")
        by_file[weight_map[stored]].append((name, stored))
    tensors = {}
    for file, names in by_file.items():
        if not file.is_file():
            raise FileNotFoundError(f"checkpoint file {file} does not exist")
        try:
            with safe_open(file, framework="pt") as reader:
                for name, stored in names:
                    # a tied LM head shares the embedding's tensor rather than a second copy
                    same = next((n for n, s in names if s == stored and n in tensors), None)
                    tensors[name] = tensors[same] if same else _read_one(
                        reader, file, stored, shapes[name], dtype)
        except CheckpointError:
            raise
        except Exception as err:  # safetensors raises its own error type for corrupt files
            raise CheckpointError(f"cannot read safetensors file {file}: {err}") from err
    return tensors


def _read_one(reader, file: Path, stored: str, shape: tuple[int, ...],
              dtype: torch.dtype) -> torch.Tensor:
    if stored not in reader.keys():
        raise CheckpointError(f"tensor {stored!r} is missing from {file}")
    got = tuple(reader.get_slice(stored).get_shape())
    if got != shape:
        raise CheckpointError(f"tensor {stored!r} in {file} has shape {list(got)}; "
                              f"expected {list(shape)}")
    return reader.get_tensor(stored).to(dtype)


def _weight_map(path: Path) -> dict[str, Path]:
    """tensor name -> the file holding it."""
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    index = path / INDEX_FILE
    if index.is_file():
        try:
            return {name: path / file for name, file in json.loads(index.read_text())["weight_map"].items()}
        except (OSError, ValueError, KeyError, AttributeError) as err:
            raise CheckpointError(f"cannot read checkpoint index {index}: {err}") from err
    single = path / SINGLE_FILE
    if not single.is_file():
        raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {path}")
    try:
        with safe_open(single, framework="pt") as reader:
            return {name: single for name in reader.keys()}
    except Exception as err:
        raise CheckpointError(f"cannot read safetensors file {single}: {err}") from err


def _module_state(config: ModelConfig, stage: StageSpec,
                  tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF tensors -> the StageModel state dict, fusing q/k/v and gate/up."""
    state = {}
    if stage.is_first:
        state["embed"] = tensors[_EMBED]
    for j, layer in enumerate(range(stage.start_layer, stage.end_layer)):
        p, m = f"model.layers.{layer}.", f"layers.{j}."
        attn = p + "self_attn."
        state[m + "input_norm.weight"] = tensors[p + "input_layernorm.weight"]
        state[m + "post_attn_norm.weight"] = tensors[p + "post_attention_layernorm.weight"]
        state[m + "attn.qkv_proj"] = torch.cat([tensors[f"{attn}{x}_proj.weight"] for x in "qkv"])
        state[m + "attn.o_proj"] = tensors[attn + "o_proj.weight"]
        if config.qkv_bias:
            state[m + "attn.qkv_bias"] = torch.cat([tensors[f"{attn}{x}_proj.bias"] for x in "qkv"])
        if config.o_bias:
            state[m + "attn.o_bias"] = tensors[attn + "o_proj.bias"]
        if config.qk_norm:
            state[m + "attn.q_norm.weight"] = tensors[attn + "q_norm.weight"]
            state[m + "attn.k_norm.weight"] = tensors[attn + "k_norm.weight"]
        state[m + "mlp.gate_up_proj"] = torch.cat([tensors[p + "mlp.gate_proj.weight"],
                                                   tensors[p + "mlp.up_proj.weight"]])
        state[m + "mlp.down_proj"] = tensors[p + "mlp.down_proj.weight"]
    if stage.is_last:
        state["norm.weight"] = tensors["model.norm.weight"]
        state["lm_head"] = tensors[_LM_HEAD]
    return state
