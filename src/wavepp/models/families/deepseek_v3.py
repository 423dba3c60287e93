"""DeepSeek-V3 (and Kimi-K2, the same architecture): multi-head latent attention with
interleaved RoPE, dense MLPs in the first layers, then MoE with shared experts and grouped
top-k routing (a sigmoid router with a score-correction bias).

Checkpoint names: self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa,
kv_a_layernorm, kv_b_proj, o_proj}; mlp.gate.{weight, e_score_correction_bias} (fp32),
mlp.experts.{e}.{gate, up, down}_proj, mlp.shared_experts.*.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from wavepp.models.families.common import dense_layers, positive, refuse_unsupported
from wavepp.models.spec import (
    DenseMLPSpec,
    IndexSpec,
    LayerSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    RopeSpec,
    YarnScaling,
    rope_parameters,
)


@dataclass(frozen=True)
class DeepseekV3Config(ModelSpec):
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    q_lora_rank: int  # 0: q projected straight from the hidden state
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate_size: int  # dense layers
    dense_layers: tuple[int, ...]  # layers with a dense MLP; the others are MoE
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    rope_scaling: YarnScaling | None = None
    rope_interleave: bool = True  # RoPE pairs (2i, 2i+1) instead of (i, i + dim/2)
    num_shared_experts: int = 0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0

    model_type = "deepseek_v3"
    architecture = "DeepseekV3ForCausalLM"
    is_mla = True
    has_indexer = False

    def __post_init__(self) -> None:
        positive(
            self, "vocab_size", "hidden_size", "num_layers", "num_heads", "max_position_embeddings"
        )
        if self.dense_layers and self.intermediate_size <= 0:
            raise ValueError(
                f"{type(self).__name__}.intermediate_size must be positive with dense layers"
            )
        self.layers  # noqa: B018 - the layer specs validate the attention and expert shapes

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def index(self, layer: int) -> IndexSpec | None:
        """The layer's DSA indexer (GLM-5); None: dense attention."""
        return None

    def is_moe(self, layer: int) -> bool:
        return layer not in self.dense_layers

    @cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        scale = self.qk_head_dim**-0.5
        if self.rope_scaling is not None:
            scale *= self.rope_scaling.softmax_factor
        moe = MoESpec(
            self.num_experts,
            self.num_experts_per_tok,
            self.moe_intermediate_size,
            self.num_shared_experts,
            n_group=self.n_group,
            topk_group=self.topk_group,
            norm_topk_prob=self.norm_topk_prob,
            routed_scaling_factor=self.routed_scaling_factor,
        )
        dense = DenseMLPSpec(self.intermediate_size) if self.dense_layers else None
        return tuple(
            LayerSpec(
                MLASpec(
                    self.num_heads,
                    self.q_lora_rank,
                    self.kv_lora_rank,
                    self.qk_nope_head_dim,
                    self.qk_rope_head_dim,
                    self.v_head_dim,
                    scale,
                    self.rope_interleave,
                    index=self.index(i),
                ),
                moe if self.is_moe(i) else dense,
            )
            for i in range(self.num_layers)
        )

    @property
    def rope(self) -> RopeSpec:
        return RopeSpec(
            self.qk_rope_head_dim,
            self.rope_theta,
            self.max_position_embeddings,
            self.rope_interleave,
            self.rope_scaling,
        )

    @classmethod
    def hf_fields(cls, hf: dict) -> dict:
        """The fields of this record in `hf` (GLM-5 adds its indexer's)."""
        refuse_unsupported(hf)
        if hf.get("attention_bias", False):
            raise ValueError("attention_bias=True is not supported for MLA")
        theta, scaling = rope_parameters(hf, cls.model_type, ("default", "yarn"))
        return dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            q_lora_rank=hf.get("q_lora_rank") or 0,
            kv_lora_rank=hf["kv_lora_rank"],
            qk_nope_head_dim=hf["qk_nope_head_dim"],
            qk_rope_head_dim=hf["qk_rope_head_dim"],
            v_head_dim=hf["v_head_dim"],
            intermediate_size=hf["intermediate_size"],
            dense_layers=dense_layers(hf, 0),
            num_experts=hf["n_routed_experts"],
            num_experts_per_tok=hf.get("num_experts_per_tok") or hf["num_experts_per_token"],
            moe_intermediate_size=hf["moe_intermediate_size"],
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
            rope_interleave=bool(hf.get("rope_interleave", True)),
            num_shared_experts=hf.get("n_shared_experts") or 0,
            n_group=hf.get("n_group") or 1,
            topk_group=hf.get("topk_group") or 1,
            norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
        )

    @classmethod
    def from_hf(cls, hf: dict) -> DeepseekV3Config:
        return cls(**cls.hf_fields(hf))


def tiny_hf_config(spec):
    """The transformers config of a tiny random checkpoint (`make_model.TinyModelSpec`)."""
    import transformers

    return transformers.DeepseekV3Config(**tiny_mla_kwargs(spec), n_group=2, topk_group=1)


def tiny_mla_kwargs(spec) -> dict:
    """The tiny MLA + MoE fields DeepSeek-V3, GLM-5 and Kimi-Linear share: one shared expert,
    the first `spec.first_k_dense` layers dense."""
    return dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=spec.max_position_embeddings,
        num_experts_per_tok=spec.num_experts_per_tok,
        bos_token_id=None,
        eos_token_id=None,
        num_key_value_heads=spec.num_heads,
        intermediate_size=spec.intermediate_size,
        moe_intermediate_size=spec.moe_intermediate_size,
        n_routed_experts=spec.num_experts,
        n_shared_experts=1,
        first_k_dense_replace=spec.first_k_dense,
        q_lora_rank=spec.q_lora_rank or None,
        kv_lora_rank=spec.kv_lora_rank,
        qk_nope_head_dim=spec.qk_nope_head_dim,
        qk_rope_head_dim=spec.qk_rope_head_dim,
        v_head_dim=spec.v_head_dim,
        routed_scaling_factor=2.5,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
    )
