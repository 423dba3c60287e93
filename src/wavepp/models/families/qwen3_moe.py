"""Qwen3-MoE: Qwen3's attention (GQA, RMSNorm over each head of q and k before RoPE) with a
softmax-routed MoE (top-k of the softmax, renormalized where norm_topk_prob; no shared
expert, no score bias). Layers in `mlp_only_layers`, or off the `decoder_sparse_step` grid,
have a dense MLP of `intermediate_size`.

Checkpoint names: mlp.gate.weight (the router, fp32 here), mlp.experts.{e}.{gate, up, down}_proj.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from wavepp.models.families.common import pick, positive, refuse_unsupported
from wavepp.models.spec import (
    DenseMLPSpec,
    GQASpec,
    LayerSpec,
    Llama3RopeScaling,
    MlpNames,
    ModelSpec,
    MoESpec,
    RopeSpec,
    rope_parameters,
)


@dataclass(frozen=True)
class Qwen3MoeConfig(ModelSpec):
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense layers
    dense_layers: tuple[int, ...]
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    rope_scaling: Llama3RopeScaling | None = None

    model_type = "qwen3_moe"
    architecture = "Qwen3MoeForCausalLM"
    mlp_names = MlpNames(router_bias=None)

    def __post_init__(self) -> None:
        positive(self, "vocab_size", "hidden_size", "num_layers", "max_position_embeddings")
        self.layers  # noqa: B018 - the layer specs validate heads and experts

    @cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        attention = GQASpec(
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.head_dim,
            self.attention_bias,
            self.attention_bias,
            "head",
        )
        moe = MoESpec(
            self.num_experts,
            self.num_experts_per_tok,
            self.moe_intermediate_size,
            scoring="softmax",
            score_bias=False,
            norm_topk_prob=self.norm_topk_prob,
        )
        dense = DenseMLPSpec(self.intermediate_size) if self.dense_layers else None
        return tuple(
            LayerSpec(attention, dense if i in self.dense_layers else moe)
            for i in range(self.num_layers)
        )

    @property
    def rope(self) -> RopeSpec:
        return RopeSpec(
            self.head_dim, self.rope_theta, self.max_position_embeddings, scaling=self.rope_scaling
        )

    @classmethod
    def from_hf(cls, hf: dict) -> Qwen3MoeConfig:
        refuse_unsupported(hf)
        if hf.get("use_sliding_window", False):
            raise ValueError("sliding-window attention layers are not supported")
        theta, scaling = rope_parameters(hf, cls.model_type, ("default", "llama3"))
        num_layers, step = hf["num_hidden_layers"], hf.get("decoder_sparse_step") or 1
        mlp_only = set(hf.get("mlp_only_layers") or ())
        num_heads = hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            intermediate_size=hf["intermediate_size"],
            dense_layers=tuple(i for i in range(num_layers) if i in mlp_only or (i + 1) % step),
            num_experts=pick(hf, "num_experts", "num_local_experts"),
            num_experts_per_tok=hf["num_experts_per_tok"],
            moe_intermediate_size=hf["moe_intermediate_size"],
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", False)),
            rope_scaling=scaling,
        )


def tiny_hf_config(spec):
    """The transformers config of a tiny random checkpoint (`make_model.TinyModelSpec`): layer 0
    dense, top-k renormalized (as Qwen3-30B-A3B and Qwen3-235B-A22B are released)."""
    import transformers

    return transformers.Qwen3MoeConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim or spec.hidden_size // spec.num_heads,
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok,
        moe_intermediate_size=spec.moe_intermediate_size,
        norm_topk_prob=True,
        mlp_only_layers=[0],
        tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        bos_token_id=None,
        eos_token_id=None,
    )
