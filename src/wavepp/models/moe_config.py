"""Configuration of the MoE and latent-attention families: MiniMax-M2, DeepSeek-V3, GLM-5.

One frozen record describes all three, parsed from an HF `config.json` by `model_type`:

    family        attention                                   MLP
    minimax_m2    GQA, q/k RMSNorm over the whole projection,  MoE in every layer, sigmoid top-k
                  RoPE on the first rotary_dim of each head    router with a score bias
    deepseek_v3   MLA: latent (kv_lora_rank) + one RoPE key    dense [0, k), then MoE with shared
                                                               experts, grouped top-k routing
    glm_moe_dsa   MLA + DSA indexer (its own keys; "shared"    as deepseek_v3
                  layers reuse the previous layer's top-k)
    kimi_linear   hybrid: KDA linear attention (recurrent     as deepseek_v3
                  state per sequence) and MLA without RoPE

Only what the runtime computes is kept; what it can not compute (other RoPE types, other
activations) is refused here with the field named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MOE_MODEL_TYPES = {"minimax_m2": "MiniMaxM2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                   "glm_moe_dsa": "GlmMoeDsaForCausalLM", "kimi_linear": "KimiLinearForCausalLM"}


@dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling (rope_type "yarn", as the released DeepSeek-V3 and Kimi-K2 use it):
    low frequencies divided by `factor`, high ones kept, a linear ramp between the dims that
    turn beta_fast and beta_slow times over original_max_position_embeddings; cos/sin scaled
    by attention_factor, and MLA's softmax scale by mscale(factor, mscale_all_dim)^2."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.original_max_position_embeddings <= 0:
            raise ValueError(f"yarn rope scaling needs factor > 0 and original_max_position_embeddings > 0, "
                             f"got {self}")

    @staticmethod
    def _mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    @property
    def cos_sin_factor(self) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return self._mscale(self.factor, self.mscale) / self._mscale(self.factor, self.mscale_all_dim)
        return self._mscale(self.factor)

    @property
    def softmax_factor(self) -> float:
        """What MLA multiplies its softmax scale by."""
        return self._mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0


@dataclass(frozen=True)
class MoEModelConfig:
    """The shape and numerics of one of the MOE_MODEL_TYPES, independent of any stage split."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    rope_scaling: YarnScaling | None = None
    # GQA (minimax_m2)
    num_kv_heads: int = 0
    head_dim: int = 0
    rotary_dim: int = 0                  # RoPE on dims [0, rotary_dim) of each head
    # MLA (deepseek_v3, glm_moe_dsa)
    q_lora_rank: int = 0                 # 0: q projected straight from the hidden state
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False        # RoPE pairs (2i, 2i+1) instead of (i, i + dim/2)
    # DSA indexer (glm_moe_dsa)
    index_topk: int = 0                  # 0: no indexer, dense attention
    index_n_heads: int = 0
    index_head_dim: int = 0
    indexer_types: tuple[str, ...] = ()  # per layer: "full" runs an indexer, "shared" reuses
    # MLP
    intermediate_size: int = 0           # dense layers
    dense_layers: tuple[int, ...] = ()   # layers with a dense MLP; the others are MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    # hybrid linear attention (kimi_linear): per layer "linear_attention" (KDA) or "full_attention" (MLA)
    layer_types: tuple[str, ...] = ()
    linear_num_heads: int = 0
    linear_head_dim: int = 0
    linear_conv_kernel: int = 0          # short convolution over q, k, v: this many taps

    def __post_init__(self) -> None:
        if self.model_type not in MOE_MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not supported here; "
                             f"supported: {', '.join(MOE_MODEL_TYPES)}")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "max_position_embeddings",
                     "num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"MoEModelConfig.{name} must be a positive int, got {value!r}")
        if self.is_mla:
            for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, name) <= 0:
                    raise ValueError(f"MoEModelConfig.{name} must be positive for MLA")
        else:
            if self.num_kv_heads <= 0 or self.head_dim <= 0 or self.num_heads % self.num_kv_heads:
                raise ValueError(f"MoEModelConfig: GQA needs num_heads={self.num_heads} a multiple of "
                                 f"num_kv_heads={self.num_kv_heads} and head_dim > 0")
            if not 0 < self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
                raise ValueError(f"MoEModelConfig.rotary_dim={self.rotary_dim} must be even and in "
                                 f"(0, head_dim={self.head_dim}]")
        if self.has_indexer:
            if len(self.indexer_types) != self.num_layers or self.indexer_types[0] != "full" \
                    or set(self.indexer_types) - {"full", "shared"}:
                raise ValueError(f"MoEModelConfig.indexer_types {list(self.indexer_types)} must give "
                                 f"'full' or 'shared' for each of {self.num_layers} layers, 'full' first")
            if self.index_n_heads <= 0 or not self.qk_rope_head_dim <= self.index_head_dim:
                raise ValueError("MoEModelConfig: the indexer needs index_n_heads > 0 and "
                                 "index_head_dim >= qk_rope_head_dim")
        if self.is_hybrid:
            if len(self.layer_types) != self.num_layers or \
                    set(self.layer_types) - {"linear_attention", "full_attention"}:
                raise ValueError(f"MoEModelConfig.layer_types {list(self.layer_types)} must give "
                                 f"'linear_attention' or 'full_attention' for each of {self.num_layers} layers")
            for name in ("linear_num_heads", "linear_head_dim", "linear_conv_kernel"):
                if getattr(self, name) <= 0:
                    raise ValueError(f"MoEModelConfig.{name} must be positive for kimi_linear")
        if self.dense_layers and self.intermediate_size <= 0:
            raise ValueError("MoEModelConfig.intermediate_size must be positive with dense layers")
        if self.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"MoEModelConfig: num_experts={self.num_experts} must split into "
                             f"n_group={self.n_group} groups, 1 <= topk_group <= n_group")
        if self.num_experts_per_tok > self.num_experts // self.n_group * self.topk_group:
            raise ValueError(f"MoEModelConfig.num_experts_per_tok={self.num_experts_per_tok} is more "
                             f"than the experts of {self.topk_group} groups")

    @property
    def architecture(self) -> str:
        return MOE_MODEL_TYPES[self.model_type]

    @property
    def is_mla(self) -> bool:
        return self.model_type != "minimax_m2"

    @property
    def is_hybrid(self) -> bool:
        """Some layers keep a recurrent state instead of per-token KV (kimi_linear)."""
        return self.model_type == "kimi_linear"

    @property
    def uses_rope(self) -> bool:
        return self.model_type != "kimi_linear"

    def is_linear(self, layer: int) -> bool:
        """This layer is KDA linear attention (state snapshots, no per-token cache)."""
        return self.is_hybrid and self.layer_types[layer] == "linear_attention"

    @property
    def has_indexer(self) -> bool:
        return self.index_topk > 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe(self, layer: int) -> bool:
        return layer not in self.dense_layers

    def runs_indexer(self, layer: int) -> bool:
        """This layer computes its own top-k (and keeps indexer keys in the cache)."""
        return self.has_indexer and self.indexer_types[layer] == "full"

    def reuses_topk(self, layer: int) -> bool:
        """This layer attends over the top-k of the layer before it (a "shared" indexer layer)."""
        return self.has_indexer and layer < self.num_layers and self.indexer_types[layer] == "shared"

    @classmethod
    def from_hf(cls, hf: dict) -> MoEModelConfig:
        """Parse the dict of an HF config.json. Raises ValueError naming what is unsupported,
        KeyError for a missing field."""
        model_type = hf.get("model_type")
        if hf.get("quantization_config"):
            raise ValueError(f"quantized checkpoints ({hf['quantization_config'].get('quant_method', '?')}) "
                             "are not supported; give a bf16 or fp32 checkpoint")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; only 'silu' (SwiGLU)")
        params = dict(hf.get("rope_scaling") or {})
        params.update(hf.get("rope_parameters") or {})
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ("default", "yarn"):
            raise ValueError(f"rope_type {rope_type!r} is not supported for {model_type}; "
                             f"supported: 'default', 'yarn'")
        yarn = None
        if rope_type == "yarn":
            factor = params.get("factor") or hf["max_position_embeddings"] / params["original_max_position_embeddings"]
            yarn = YarnScaling(
                factor=float(factor), original_max_position_embeddings=int(params["original_max_position_embeddings"]),
                beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                mscale=float(params.get("mscale") or 0), mscale_all_dim=float(params.get("mscale_all_dim") or 0),
                attention_factor=params.get("attention_factor"), truncate=bool(params.get("truncate", True)))
        common = dict(
            model_type=model_type, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))),
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            num_experts_per_tok=hf.get("num_experts_per_tok") or hf["num_experts_per_token"],
            rope_scaling=yarn,
        )
        if model_type == "minimax_m2":
            if hf.get("use_qk_norm", True) is False or hf.get("qk_norm_type", "per_layer") != "per_layer":
                raise ValueError("minimax_m2 without q/k RMSNorm over the whole projection "
                                 "(use_qk_norm, qk_norm_type 'per_layer') is not supported")
            head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
            factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
            rotary_dim = hf.get("rotary_dim") or int(head_dim * (factor or 1.0))
            return cls(**common, num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
                       head_dim=head_dim, rotary_dim=rotary_dim, num_experts=hf["num_local_experts"],
                       moe_intermediate_size=hf["intermediate_size"])
        if model_type == "kimi_linear":
            return cls._kimi_linear_from_hf(hf, common)
        if model_type not in ("deepseek_v3", "glm_moe_dsa"):
            raise ValueError(f"model_type {model_type!r} is not supported here; "
                             f"supported: {', '.join(MOE_MODEL_TYPES)}")
        if hf.get("attention_bias", False):
            raise ValueError("attention_bias=True is not supported for MLA")
        num_layers = hf["num_hidden_layers"]
        mlp_types = hf.get("mlp_layer_types")
        if mlp_types is None:
            first_k = min(hf.get("first_k_dense_replace", 0), num_layers)
            mlp_types = ["dense"] * first_k + ["sparse"] * (num_layers - first_k)
        indexer = {}
        if model_type == "glm_moe_dsa":
            indexer = dict(index_topk=hf["index_topk"], index_n_heads=hf["index_n_heads"],
                           index_head_dim=hf["index_head_dim"],
                           indexer_types=tuple(hf.get("indexer_types") or ["full"] * num_layers))
        return cls(
            **common, q_lora_rank=hf.get("q_lora_rank") or 0, kv_lora_rank=hf["kv_lora_rank"],
            qk_nope_head_dim=hf["qk_nope_head_dim"], qk_rope_head_dim=hf["qk_rope_head_dim"],
            v_head_dim=hf["v_head_dim"],
            rope_interleave=model_type == "glm_moe_dsa" or bool(hf.get("rope_interleave", True)),
            intermediate_size=hf["intermediate_size"],
            dense_layers=tuple(i for i, kind in enumerate(mlp_types) if kind == "dense"),
            num_experts=hf["n_routed_experts"], moe_intermediate_size=hf["moe_intermediate_size"],
            num_shared_experts=hf.get("n_shared_experts") or 0, n_group=hf.get("n_group") or 1,
            topk_group=hf.get("topk_group") or 1, norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)), **indexer)

    @classmethod
    def _kimi_linear_from_hf(cls, hf: dict, common: dict) -> MoEModelConfig:
        # KimiLinearConfig stores some fields under other names (its attribute_map), and a
        # released checkpoint keeps the linear-attention fields in a sub-dict with 1-based layers
        num_layers = hf["num_hidden_layers"]
        linear = hf.get("linear_attn_config") or {}
        layer_types = hf.get("layer_types")
        if layer_types is None and "kda_layers" in linear:
            kda = set(linear["kda_layers"])
            layer_types = ["linear_attention" if i + 1 in kda else "full_attention" for i in range(num_layers)]
        if layer_types is None:
            layer_types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(num_layers)]
        mlp_types = hf.get("mlp_layer_types")
        if mlp_types is None:
            first_k = min(hf.get("first_k_dense_replace", 1), num_layers)
            mlp_types = ["dense"] * first_k + ["sparse"] * (num_layers - first_k)
        pick = lambda *names, default=None: next((hf[n] for n in names if hf.get(n) is not None), default)  # noqa: E731
        common = dict(common, max_position_embeddings=pick("model_max_length", "max_position_embeddings",
                                                           default=1048576))
        return cls(
            **common, q_lora_rank=hf.get("q_lora_rank") or 0, kv_lora_rank=hf["kv_lora_rank"],
            qk_nope_head_dim=hf["qk_nope_head_dim"], qk_rope_head_dim=hf["qk_rope_head_dim"],
            v_head_dim=hf["v_head_dim"], intermediate_size=hf["intermediate_size"],
            dense_layers=tuple(i for i, kind in enumerate(mlp_types) if kind == "dense"),
            num_experts=pick("num_experts", "num_local_experts"), moe_intermediate_size=hf["moe_intermediate_size"],
            num_shared_experts=pick("num_shared_experts", "n_shared_experts", default=0),
            n_group=pick("num_expert_group", "n_group", default=1), topk_group=hf.get("topk_group") or 1,
            norm_topk_prob=bool(pick("moe_renormalize", "norm_topk_prob", default=True)),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
            layer_types=tuple(layer_types),
            linear_num_heads=linear.get("num_heads", hf.get("linear_num_heads", 32)),
            linear_head_dim=linear.get("head_dim", hf.get("linear_head_dim", 128)),
            linear_conv_kernel=linear.get("short_conv_kernel_size", hf.get("linear_conv_kernel_dim", 4)))
