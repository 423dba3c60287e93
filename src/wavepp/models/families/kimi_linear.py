"""Kimi-Linear: a hybrid. Most layers are Kimi delta attention (linear attention with a
recurrent state per sequence, resumable only at a saved snapshot); every few layers are MLA
without RoPE (position comes from the KDA layers). Layer 0 has a dense MLP, the rest MoE with a
shared expert and grouped sigmoid routing.

Checkpoint names (as released and as transformers saves it):
    KDA layers   self_attn.{q,k,v}_proj, {q,k,v}_conv1d [C, 1, taps], f_a/f_b/g_a/g_b/b/o_proj,
                 dt_bias (fp32), A_log [1, 1, heads, 1], o_norm
    MLA layers   self_attn.{q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}
    MLP          block_sparse_moe.{gate, up, down}_proj on dense layers; block_sparse_moe.gate.
                 {weight, e_score_correction_bias} (fp32), experts.{e}.{w1, w3, w2}, shared_experts.*
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from wavepp.models.families.common import dense_layers, pick, positive, refuse_unsupported
from wavepp.models.families.deepseek_v3 import tiny_mla_kwargs
from wavepp.models.spec import (
    DenseMLPSpec,
    KDASpec,
    LayerSpec,
    MLASpec,
    MlpNames,
    ModelSpec,
    MoESpec,
    YarnScaling,
    rope_parameters,
)


@dataclass(frozen=True)
class KimiLinearConfig(ModelSpec):
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    layer_types: tuple[str, ...]  # per layer "linear_attention" (KDA) or "full_attention" (MLA)
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    linear_num_heads: int
    linear_head_dim: int
    linear_conv_kernel: int  # short convolution over q, k, v: this many taps
    intermediate_size: int
    dense_layers: tuple[int, ...]
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    rope_scaling: YarnScaling | None = None
    num_shared_experts: int = 0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0

    model_type = "kimi_linear"
    architecture = "KimiLinearForCausalLM"
    mlp_names = MlpNames(
        dense_block="block_sparse_moe", moe_block="block_sparse_moe", expert=("w1", "w3", "w2")
    )
    uses_rope = False

    def __post_init__(self) -> None:
        positive(
            self, "vocab_size", "hidden_size", "num_layers", "num_heads", "max_position_embeddings"
        )
        if len(self.layer_types) != self.num_layers or set(self.layer_types) - {
            "linear_attention",
            "full_attention",
        }:
            raise ValueError(
                f"KimiLinearConfig.layer_types {list(self.layer_types)} must give "
                f"'linear_attention' or 'full_attention' for each of {self.num_layers} layers"
            )
        self.layers  # noqa: B018 - the layer specs validate their shapes

    @cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        if self.rope_scaling is not None:
            scale *= self.rope_scaling.softmax_factor
        mla = MLASpec(
            self.num_heads,
            self.q_lora_rank,
            self.kv_lora_rank,
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.v_head_dim,
            scale,
            rotates=False,
        )
        kda = KDASpec(
            self.linear_num_heads, self.linear_head_dim, self.linear_conv_kernel, self.rms_norm_eps
        )
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
                kda if kind == "linear_attention" else mla, dense if i in self.dense_layers else moe
            )
            for i, kind in enumerate(self.layer_types)
        )

    @property
    def rope(self) -> None:
        return None

    @classmethod
    def from_hf(cls, hf: dict) -> KimiLinearConfig:
        # KimiLinearConfig stores some fields under other names (its attribute_map), and a
        # released checkpoint keeps the linear-attention fields in a sub-dict with 1-based layers
        refuse_unsupported(hf)
        _, scaling = rope_parameters(hf, cls.model_type, ("default", "yarn"))
        num_layers = hf["num_hidden_layers"]
        linear = hf.get("linear_attn_config") or {}
        layer_types = hf.get("layer_types")
        if layer_types is None and "kda_layers" in linear:
            kda = set(linear["kda_layers"])
            layer_types = [
                "linear_attention" if i + 1 in kda else "full_attention" for i in range(num_layers)
            ]
        if layer_types is None:
            layer_types = [
                "full_attention" if i and i % 4 == 0 else "linear_attention"
                for i in range(num_layers)
            ]
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=num_layers,
            num_heads=hf["num_attention_heads"],
            layer_types=tuple(layer_types),
            q_lora_rank=hf.get("q_lora_rank") or 0,
            kv_lora_rank=hf["kv_lora_rank"],
            qk_nope_head_dim=hf["qk_nope_head_dim"],
            qk_rope_head_dim=hf["qk_rope_head_dim"],
            v_head_dim=hf["v_head_dim"],
            linear_num_heads=linear.get("num_heads", hf.get("linear_num_heads", 32)),
            linear_head_dim=linear.get("head_dim", hf.get("linear_head_dim", 128)),
            linear_conv_kernel=linear.get(
                "short_conv_kernel_size", hf.get("linear_conv_kernel_dim", 4)
            ),
            intermediate_size=hf["intermediate_size"],
            dense_layers=dense_layers(hf, 1),
            num_experts=pick(hf, "num_experts", "num_local_experts"),
            num_experts_per_tok=hf.get("num_experts_per_tok") or hf["num_experts_per_token"],
            moe_intermediate_size=hf["moe_intermediate_size"],
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=pick(
                hf, "model_max_length", "max_position_embeddings", default=1048576
            ),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
            num_shared_experts=pick(hf, "num_shared_experts", "n_shared_experts", default=0),
            n_group=pick(hf, "num_expert_group", "n_group", default=1),
            topk_group=hf.get("topk_group") or 1,
            norm_topk_prob=bool(pick(hf, "moe_renormalize", "norm_topk_prob", default=True)),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
        )

    def is_moe(self, layer: int) -> bool:
        return layer not in self.dense_layers


def tiny_hf_config(spec):
    """The transformers config of a tiny random checkpoint (`make_model.TinyModelSpec`): KDA
    everywhere but every third layer (layer 2, 5, ...), MLA without RoPE, q from the hidden
    state as released."""
    import transformers

    layer_types = spec.layer_types or tuple(
        "full_attention" if i % 3 == 2 else "linear_attention" for i in range(spec.num_layers)
    )
    kimi = {
        k: v
        for k, v in tiny_mla_kwargs(spec).items()
        if k not in ("rope_parameters", "n_routed_experts")
    }
    kimi["q_lora_rank"] = None
    return transformers.KimiLinearConfig(
        **kimi,
        num_local_experts=spec.num_experts,
        n_group=2,
        topk_group=1,
        linear_num_heads=spec.linear_num_heads,
        linear_head_dim=spec.linear_head_dim,
        linear_conv_kernel_dim=4,
        layer_types=list(layer_types),
        pad_token_id=None,
    )
