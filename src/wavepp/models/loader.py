"""Load one stage's slice of an HF checkpoint: only the tensors that slice needs are read.

Reads `model.safetensors`, or a sharded checkpoint through `model.safetensors.index.json`
(then only the shards that hold the slice's tensors are opened). Which tensors make which
parameter is data on the model (`ModelSpec.stage_params`, `spec/weights.py`): this loader is
the same for every family.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
import xxhash
from safetensors import safe_open

from wavepp.models.registry import load_model_config
from wavepp.models.spec import Param, StageSpec
from wavepp.models.stage_model import StageModel

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint file is unreadable, or lacks or mis-shapes a tensor the stage needs."""


def load_stage_model(
    model_path: str | Path, stage: StageSpec | None = None, dtype: torch.dtype = torch.bfloat16
) -> StageModel:
    """Build the stage slice `stage` (default: the whole model) from the HF checkpoint at
    `model_path`, in `dtype` (torch.bfloat16 or torch.float32; parameters marked fp32 stay fp32).

    Raises FileNotFoundError naming a missing directory or file, CheckpointError naming an
    unreadable file or a missing / wrongly shaped tensor, ValueError for an unsupported config
    or a layer range outside the model.
    """
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {dtype} is not supported; use torch.bfloat16 or torch.float32")
    spec = load_model_config(model_path)
    stage = stage or StageSpec.whole(spec.num_layers)
    if stage.num_layers != spec.num_layers:
        raise ValueError(
            f"stage layer range [{stage.start_layer}, {stage.end_layer}) was made for "
            f"{stage.num_layers} layers; the model at {model_path} has {spec.num_layers}"
        )
    params = spec.stage_params(stage)
    tensors = {}
    for fp32 in (False, True):
        group = [p for p in params if p.fp32 == fp32]
        shapes = {name: shape for p in group for name, shape in p.sources}
        aliases = {p.sources[0][0]: p.fallback for p in group if p.fallback}
        tensors.update(read_tensors(model_path, shapes, torch.float32 if fp32 else dtype, aliases))
    model = StageModel(spec, stage, dtype)
    model.load_state_dict(
        {p.target: _combine(p, tensors) for p in params}, strict=True, assign=True
    )
    return model.eval()


def read_tensors(
    model_path: str | Path,
    shapes: dict[str, tuple[int, ...]],
    dtype: torch.dtype,
    aliases: dict[str, str] | None = None,
) -> dict[str, torch.Tensor]:
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
                    tensors[name] = (
                        tensors[same]
                        if same
                        else _read_one(reader, file, stored, shapes[name], dtype)
                    )
        except CheckpointError:
            raise
        except Exception as err:  # safetensors raises its own error type for corrupt files
            raise CheckpointError(f"cannot read safetensors file {file}: {err}") from err
    return tensors


def _read_one(
    reader, file: Path, stored: str, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    if stored not in reader.keys():
        raise CheckpointError(f"tensor {stored!r} is missing from {file}")
    got = tuple(reader.get_slice(stored).get_shape())
    if got != shape:
        raise CheckpointError(
            f"tensor {stored!r} in {file} has shape {list(got)}; expected {list(shape)}"
        )
    return reader.get_tensor(stored).to(dtype)


def _weight_map(path: Path) -> dict[str, Path]:
    """tensor name -> the file holding it."""
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    index = path / INDEX_FILE
    if index.is_file():
        try:
            return {
                name: path / file
                for name, file in json.loads(index.read_text())["weight_map"].items()
            }
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


def _combine(param: Param, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The parameter from its source tensors (`spec/weights.py` names the combines)."""
    parts = [tensors[name] for name, _ in param.sources]
    if param.combine == "one":
        return parts[0]
    if param.combine == "cat":
        return torch.cat(parts)
    if param.combine == "stack":
        return torch.stack(parts)
    if param.combine == "stack_pairs":
        return torch.stack([torch.cat(pair) for pair in zip(parts[0::2], parts[1::2])])
    if param.combine == "conv":
        return torch.cat([t[:, 0] for t in parts])
    return parts[0].flatten()


def checkpoint_fingerprint(path: str | Path, sample_bytes: int = 1 << 20) -> str:
    """A short name of a checkpoint's contents (16 hex digits): its config.json and, of each
    weight file, its size and its first and last `sample_bytes`. Two directories with the same
    name give equal KV only when this agrees, so a KV store shared across hosts keys by it."""
    path = Path(path)
    digest = xxhash.xxh3_64()
    config = path / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for file in sorted(set(_weight_map(path).values())):
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with open(file, "rb") as f:
            digest.update(f.read(sample_bytes))
            f.seek(max(0, size - sample_bytes))
            digest.update(f.read(sample_bytes))
    return digest.hexdigest()
