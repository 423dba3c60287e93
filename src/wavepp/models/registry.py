"""The model families, by HF model_type (`FAMILIES`: one line each), imported only when used.

A family module (`families/`) defines its config record (a `ModelSpec` with `from_hf`) and
`tiny_hf_config(spec)` for `make_model`. Pure Python: importing a family imports no torch, so
the simulator reads configs through the same code as the runtime.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

from wavepp.models.spec import ModelSpec

# model_type -> (family module, architecture, config record class)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "llama": ("llama", "LlamaForCausalLM", "LlamaConfig"),
    "qwen2": ("llama", "Qwen2ForCausalLM", "LlamaConfig"),
    "qwen3": ("llama", "Qwen3ForCausalLM", "LlamaConfig"),
    "minimax_m2": ("minimax_m2", "MiniMaxM2ForCausalLM", "MiniMaxM2Config"),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3ForCausalLM", "DeepseekV3Config"),
    "glm_moe_dsa": ("glm_moe_dsa", "GlmMoeDsaForCausalLM", "GlmMoeDsaConfig"),
    "kimi_linear": ("kimi_linear", "KimiLinearForCausalLM", "KimiLinearConfig"),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig"),
}

MODEL_TYPES = tuple(FAMILIES)
SUPPORTED_ARCHITECTURES = tuple(architecture for _, architecture, _ in FAMILIES.values())


def family(model_type: str) -> ModuleType:
    """The family module of `model_type`. Raises ValueError listing the supported ones."""
    if model_type not in FAMILIES:
        raise ValueError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(MODEL_TYPES)}"
        )
    return importlib.import_module(f"wavepp.models.families.{FAMILIES[model_type][0]}")


def parse_config(hf: dict) -> ModelSpec:
    """The config record of an HF config.json dict, by its model_type (or, where that is
    absent or unknown, its architecture). Raises ValueError naming what is unsupported,
    KeyError for a missing field."""
    if not isinstance(hf, dict):
        raise ValueError(f"config.json holds a {type(hf).__name__}, not an object")
    model_type = _model_type(hf)
    _, _, record = FAMILIES[model_type]
    return getattr(family(model_type), record).from_hf(hf)


def load_model_config(model_path: str | Path) -> ModelSpec:
    """Read `<model_path>/config.json` into its family's config record. Raises
    FileNotFoundError naming the missing path, ValueError naming the file and what it holds
    that is not supported."""
    path = Path(model_path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} does not exist: not an HF-format model directory")
    try:
        hf = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{config_file} is not readable JSON: {err}") from err
    try:
        return parse_config(hf)
    except KeyError as err:
        raise ValueError(f"{config_file} lacks the field {err.args[0]!r}") from err
    except ValueError as err:
        raise ValueError(f"{config_file}: {err}") from err


def _model_type(hf: dict) -> str:
    model_type = hf.get("model_type")
    if model_type in FAMILIES:
        return model_type
    # A config converted from GGUF may carry no model_type, or "architectures": null.
    names = hf.get("architectures") or []
    by_architecture = {architecture: t for t, (_, architecture, _) in FAMILIES.items()}
    if len(names) == 1 and names[0] in by_architecture:
        return by_architecture[names[0]]
    raise ValueError(
        f"architecture {names or None} (model_type {model_type!r}) is not supported; supported: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)} (model types {', '.join(MODEL_TYPES)})"
    )
