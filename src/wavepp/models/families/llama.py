"""The Llama family: Llama, Qwen2, Qwen3. One decoder layer, differing in attention biases and
per-head q/k norms:

    model       attention (GQA, RoPE rotate-half on the whole head)     MLP
    llama       no biases (attention_bias: q, k, v and o biases)        dense SwiGLU
    qwen2       q, k, v biases
    qwen3       RMSNorm over each head of q and k before RoPE

Checkpoint names: the standard ones (`spec/attention.py`, `spec/weights.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from wavepp.models.spec import (
    DenseMLPSpec,
    GQASpec,
    LayerSpec,
    Llama3RopeScaling,
    ModelSpec,
    RopeSpec,
    rope_parameters,
)

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


@dataclass(frozen=True)
class LlamaConfig(ModelSpec):
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
    qkv_bias: bool = False  # bias on q/k/v projections (Qwen2; Llama with attention_bias)
    o_bias: bool = False  # bias on the output projection (Llama/Qwen3 attention_bias)
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3)
    rope_scaling: Llama3RopeScaling | None = None

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES.values():
            raise ValueError(
                f"architecture {self.architecture!r} is not supported; "
                f"supported: {', '.join(ARCHITECTURES.values())}"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"LlamaConfig.num_heads={self.num_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim={self.head_dim} must be even for RoPE")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(
                f"LlamaConfig needs rms_norm_eps > 0 and rope_theta > 0, "
                f"got {self.rms_norm_eps}, {self.rope_theta}"
            )

    @property
    def model_type(self) -> str:
        return next(t for t, a in ARCHITECTURES.items() if a == self.architecture)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        layer = LayerSpec(
            GQASpec(
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.head_dim,
                self.qkv_bias,
                self.o_bias,
                "head" if self.qk_norm else "none",
            ),
            DenseMLPSpec(self.intermediate_size),
        )
        return (layer,) * self.num_layers

    @property
    def rope(self) -> RopeSpec:
        return RopeSpec(
            self.head_dim, self.rope_theta, self.max_position_embeddings, scaling=self.rope_scaling
        )

    @classmethod
    def from_hf(cls, hf: dict) -> LlamaConfig:
        """Parse the dict of an HF config.json. Raises ValueError naming what is unsupported."""
        architecture = _architecture(hf)
        num_heads = hf["num_attention_heads"]
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(
                f"hidden_act {hf['hidden_act']!r} is not supported; only 'silu' (SwiGLU)"
            )
        if hf.get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported")
        if hf.get("use_sliding_window", False) and "sliding_attention" in (
            hf.get("layer_types") or ()
        ):
            raise ValueError("sliding-window attention layers are not supported")
        rope_theta, rope_scaling = rope_parameters(
            hf, hf.get("model_type") or architecture, ("default", "llama3")
        )
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


def tiny_hf_config(spec):
    """The transformers config of a tiny random checkpoint (`make_model.TinyModelSpec`)."""
    import transformers

    cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[spec.arch]
    kwargs = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim or spec.hidden_size // spec.num_heads,
        tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
    )
    if spec.arch == "llama":
        kwargs["attention_bias"] = False
    return cls(**kwargs)


def _architecture(hf: dict) -> str:
    # A config converted from GGUF may carry "architectures": null; model_type then decides.
    names = hf.get("architectures") or [
        ARCHITECTURES.get(hf.get("model_type"), hf.get("model_type"))
    ]
    if len(names) != 1 or names[0] not in ARCHITECTURES.values():
        raise ValueError(
            f"architecture {names} (model_type {hf.get('model_type')!r}) is not supported; "
            f"supported: {', '.join(ARCHITECTURES.values())}"
        )
    return names[0]
