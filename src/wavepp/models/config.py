"""Model and stage configuration: what one stage process needs to know to build its slice.

`ModelConfig` is parsed from an HF `config.json` of the Llama family (Llama, Qwen2, Qwen3:
same decoder layer, differing in attention biases and per-head q/k norms). `StageSpec` names
the half-open layer range [start_layer, end_layer) one stage owns; the first stage also owns
the token embedding, the last the final norm and the LM head.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from wavepp.models.moe_config import MOE_MODEL_TYPES, MoEModelConfig

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM"}


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1 frequency-dependent RoPE scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.low_freq_factor <= 0:
            raise ValueError(f"llama3 rope scaling needs positive factors, got {self}")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"llama3 rope scaling needs high_freq_factor > low_freq_factor, got {self}")


@dataclass(frozen=True)
class ModelConfig:
    """The shape and numerics of a Llama-family decoder, independent of any stage split."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False          # bias on q/k/v projections (Qwen2; Llama with attention_bias)
    o_bias: bool = False            # bias on the output projection (Llama/Qwen3 attention_bias)
    qk_norm: bool = False           # RMSNorm over head_dim on q and k before RoPE (Qwen3)
    rope_scaling: Llama3RopeScaling | None = None

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"architecture {self.architecture!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads={self.num_heads} must be a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(f"ModelConfig needs rms_norm_eps > 0 and rope_theta > 0, "
                             f"got {self.rms_norm_eps}, {self.rope_theta}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        """Parse the dict of an HF config.json. Raises ValueError naming what is unsupported."""
        architecture = _architecture(hf)
        num_heads = hf["num_attention_heads"]
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; only 'silu' (SwiGLU)")
        if hf.get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported")
        if hf.get("use_sliding_window", False) and "sliding_attention" in (hf.get("layer_types") or ()):
            raise ValueError("sliding-window attention layers are not supported")
        rope_theta, rope_scaling = _rope(hf)
        attention_bias = bool(hf.get("attention_bias", False))
        return cls(
            architecture=architecture,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias or architecture == "Qwen2ForCausalLM",
            o_bias=attention_bias and architecture != "Qwen2ForCausalLM",
            qk_norm=architecture == "Qwen3ForCausalLM",
            rope_scaling=rope_scaling,
        )


def load_model_config(model_path: str | Path) -> ModelConfig | MoEModelConfig:
    """Read `<model_path>/config.json`: a ModelConfig (Llama family) or, by model_type, a
    MoEModelConfig. Raises FileNotFoundError naming the missing path, ValueError naming the
    file and what it holds that is not supported."""
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
        if isinstance(hf, dict) and hf.get("model_type") in MOE_MODEL_TYPES:
            return MoEModelConfig.from_hf(hf)
        return ModelConfig.from_hf(hf)
    except KeyError as err:
        raise ValueError(f"{config_file} lacks the field {err.args[0]!r}") from err
    except ValueError as err:
        raise ValueError(f"{config_file}: {err}") from err


@dataclass(frozen=True)
class StageSpec:
    """The layers [start_layer, end_layer) of a `num_layers`-layer model that one stage owns."""

    start_layer: int
    end_layer: int
    num_layers: int

    def __post_init__(self) -> None:
        if not 0 <= self.start_layer < self.end_layer <= self.num_layers:
            raise ValueError(f"stage layer range [{self.start_layer}, {self.end_layer}) is outside "
                             f"the model's {self.num_layers} layers (need 0 <= start < end <= "
                             f"{self.num_layers})")

    @property
    def is_first(self) -> bool:
        """Owns the token embedding: takes input ids."""
        return self.start_layer == 0

    @property
    def is_last(self) -> bool:
        """Owns the final norm and LM head: returns logits."""
        return self.end_layer == self.num_layers

    @property
    def num_stage_layers(self) -> int:
        return self.end_layer - self.start_layer

    @classmethod
    def whole(cls, num_layers: int) -> StageSpec:
        return cls(0, num_layers, num_layers)


def split_layers(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Balanced contiguous split: stage sizes differ by at most one, the larger ones first
    (the last stage also runs the final norm and LM head)."""
    if num_stages < 1 or num_stages > num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {num_stages} stages "
                         f"(need 1 <= num_stages <= {num_layers})")
    base, extra = divmod(num_layers, num_stages)
    ranges, start = [], 0
    for stage in range(num_stages):
        end = start + base + (1 if stage < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


def stage_specs(num_layers: int, num_stages: int) -> list[StageSpec]:
    return [StageSpec(start, end, num_layers) for start, end in split_layers(num_layers, num_stages)]


def _architecture(hf: dict) -> str:
    # A config converted from GGUF may carry "architectures": null; model_type then decides.
    names = hf.get("architectures") or [_MODEL_TYPES.get(hf.get("model_type"), hf.get("model_type"))]
    if len(names) != 1 or names[0] not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"architecture {names} (model_type {hf.get('model_type')!r}) is not supported; "
                         f"supported: {', '.join(SUPPORTED_ARCHITECTURES)} and model types "
                         f"{', '.join(MOE_MODEL_TYPES)}")
    return names[0]


def _rope(hf: dict) -> tuple[float, Llama3RopeScaling | None]:
    # transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; older configs carry
    # rope_theta at the top level and an optional rope_scaling dict.
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3":
        scaling = Llama3RopeScaling(
            factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]))
        return theta, scaling
    raise ValueError(f"rope_type {rope_type!r} is not supported; supported: 'default', 'llama3'")

