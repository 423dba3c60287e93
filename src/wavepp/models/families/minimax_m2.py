"""MiniMax-M2: GQA whose q and k are RMS-normalized over the whole projection (all heads at
once), rotated on the first `rotary_dim` dims of each head; MoE in every layer with a sigmoid
router and a score-correction bias, no shared experts.

Checkpoint names: block_sparse_moe.gate / e_score_correction_bias (the router, fp32) and
block_sparse_moe.experts.{e}.{w1, w3, w2} (gate, up, down).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from wavepp.models.families.common import positive, refuse_unsupported
from wavepp.models.spec import (
    GQASpec,
    LayerSpec,
    MlpNames,
    ModelSpec,
    MoESpec,
    RopeSpec,
    YarnScaling,
    rope_parameters,
)


@dataclass(frozen=True)
class MiniMaxM2Config(ModelSpec):
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # RoPE on dims [0, rotary_dim) of each head
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    rope_scaling: YarnScaling | None = None

    model_type = "minimax_m2"
    architecture = "MiniMaxM2ForCausalLM"
    mlp_names = MlpNames(
        moe_block="block_sparse_moe",
        expert=("w1", "w3", "w2"),
        router_bias="e_score_correction_bias",
    )
    num_shared_experts = 0
    dense_layers = ()

    def __post_init__(self) -> None:
        positive(
            self, "vocab_size", "hidden_size", "num_layers", "num_heads", "max_position_embeddings"
        )
        self.layers  # noqa: B018 - the layer specs validate heads, rotary dims and experts

    @cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        attention = GQASpec(
            self.num_heads, self.num_kv_heads, self.head_dim, self.rotary_dim, qk_norm="projection"
        )
        moe = MoESpec(self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size)
        return (LayerSpec(attention, moe),) * self.num_layers

    @property
    def rope(self) -> RopeSpec:
        return RopeSpec(
            self.rotary_dim,
            self.rope_theta,
            self.max_position_embeddings,
            scaling=self.rope_scaling,
        )

    @classmethod
    def from_hf(cls, hf: dict) -> MiniMaxM2Config:
        refuse_unsupported(hf)
        if (
            hf.get("use_qk_norm", True) is False
            or hf.get("qk_norm_type", "per_layer") != "per_layer"
        ):
            raise ValueError(
                "minimax_m2 without q/k RMSNorm over the whole projection "
                "(use_qk_norm, qk_norm_type 'per_layer') is not supported"
            )
        theta, scaling = rope_parameters(hf, cls.model_type, ("default", "yarn"))
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        params = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
        factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=head_dim,
            rotary_dim=hf.get("rotary_dim") or int(head_dim * (factor or 1.0)),
            num_experts=hf["num_local_experts"],
            num_experts_per_tok=hf.get("num_experts_per_tok") or hf["num_experts_per_token"],
            moe_intermediate_size=hf["intermediate_size"],
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
        )


def tiny_hf_config(spec):
    """The transformers config of a tiny random checkpoint (`make_model.TinyModelSpec`)."""
    import transformers

    return transformers.MiniMaxM2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=spec.max_position_embeddings,
        num_experts_per_tok=spec.num_experts_per_tok,
        bos_token_id=None,
        eos_token_id=None,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim or spec.hidden_size // spec.num_heads,
        num_local_experts=spec.num_experts,
        intermediate_size=spec.moe_intermediate_size,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": spec.rope_theta,
            "partial_rotary_factor": 0.5,
        },
    )
