"""Model shapes for the cost model (the named models, from their public config.json values, are
in model_catalog.py).

Only what decides compute, memory and traffic: layer count, widths, the attention kind of each
layer (GQA, MLA with optional DeepSeek sparse attention, or linear attention), and the MoE
layout (experts, top-k, shared experts, expert FFN width, leading dense layers).
"""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.models.registry import parse_config
from wavepp.models.spec import ModelSpec


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    attention: str = "gqa"  # full-attention layers: "gqa" | "mla"
    num_kv_heads: int = 0  # gqa
    head_dim: int = 0  # gqa
    q_lora_rank: int = 0  # mla: 0 = q projected straight from the hidden state
    kv_lora_rank: int = 0  # mla latent width
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    index_topk: int = 0  # DeepSeek sparse attention: keys kept per query (0: dense)
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_layers: tuple[int, ...] | None = (
        None  # layers running an indexer (None: all; others share)
    )
    index_key_bytes: float = 0.0  # bytes per cached indexer key element (0: fp8 + fp32 scale)
    qk_norm: bool = False  # gqa: RMSNorm weights over the q and k projections
    qk_norm_per_head: bool = False  # gqa: those norms are per head (Qwen3), not per projection
    linear_layers: tuple[int, ...] = ()  # 0-based layers with linear attention (hybrid models)
    linear_num_heads: int = 0
    linear_head_dim: int = 0
    linear_conv_kernel: int = 4  # short convolution taps over q, k, v (its state: taps - 1 rows)
    intermediate_size: int = 0  # dense MLP layers
    first_k_dense: int = 0  # layers [0, k) have a dense MLP
    num_experts: int = 0  # 0: every layer dense
    num_experts_per_tok: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0
    router_bias: bool = True  # MoE routers: a score-correction bias per expert (not Qwen3-MoE)
    weight_bytes: float = 1.0  # bytes per parameter as served (FP8 checkpoints: 1)
    gemm_dtype: str = "fp8"  # dtype of the linear layers' tensor-core math
    kv_bytes: float = 2.0  # bytes per cached K/V (or latent) element (bf16)
    attn_dtype: str = (
        "bf16"  # tensor-core math of full attention: bf16 | fp8 (sim/cost/precision.py)
    )
    # attention projections served in another format than the linear layers': (name, bytes per
    # weight, GEMM dtype) per projection (`attention_param_groups` names; sim/cost/precision.py)
    projection_weights: tuple[tuple[str, float, str], ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "vocab_size", "num_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelShape.{name} must be positive, got {getattr(self, name)}")
        if self.attn_dtype not in ("bf16", "fp8"):
            raise ValueError(
                f"ModelShape.attn_dtype must be 'bf16' or 'fp8', got {self.attn_dtype!r}"
            )
        if self.attention not in ("gqa", "mla"):
            raise ValueError(f"ModelShape.attention must be 'gqa' or 'mla', got {self.attention!r}")
        if self.attention == "gqa" and (self.num_kv_heads <= 0 or self.head_dim <= 0):
            raise ValueError("ModelShape: gqa needs num_kv_heads and head_dim")
        if self.attention == "mla" and (self.kv_lora_rank <= 0 or self.v_head_dim <= 0):
            raise ValueError("ModelShape: mla needs kv_lora_rank and v_head_dim")
        if self.num_experts and (self.num_experts_per_tok <= 0 or self.moe_intermediate_size <= 0):
            raise ValueError("ModelShape: MoE needs num_experts_per_tok and moe_intermediate_size")
        if any(not 0 <= i < self.num_layers for i in self.linear_layers):
            raise ValueError("ModelShape.linear_layers out of range")

    # ---- per layer -------------------------------------------------------------------------

    def is_linear(self, layer: int) -> bool:
        return layer in self.linear_layers

    def is_moe(self, layer: int) -> bool:
        return self.num_experts > 0 and layer >= self.first_k_dense

    @property
    def hybrid(self) -> bool:
        return bool(self.linear_layers)

    @property
    def sparse_attention(self) -> bool:
        return self.index_topk > 0

    def runs_indexer(self, layer: int) -> bool:
        return self.sparse_attention and (self.index_layers is None or layer in self.index_layers)

    def attention_params(self, layer: int) -> int:
        """Projection weights of one layer's attention block (MLA: the kv up-projection too)."""
        return sum(self.attention_param_groups(layer).values())

    def attention_param_groups(self, layer: int) -> dict[str, int]:
        """The attention block's projections by name, each its weight count: MLA "q_a", "q_b"
        (or "q" without a q latent), "kv_a", "kv_b", "o" and a DSA "indexer"; GQA "qkv" and
        "o"; linear attention "linear". `projection_weights` may serve some in another format."""
        h = self.hidden_size
        if self.is_linear(layer):
            inner = self.linear_num_heads * self.linear_head_dim
            # q, k, v, o; low-rank forget and output gates (hidden -> head_dim -> inner); beta
            return {
                "linear": 4 * h * inner
                + 2 * (h * self.linear_head_dim + self.linear_head_dim * inner)
                + h * self.linear_num_heads
            }
        if self.attention == "gqa":
            return {
                "qkv": h * self.head_dim * (self.num_heads + 2 * self.num_kv_heads),
                "o": self.num_heads * self.head_dim * h,
            }
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            groups = {"q_a": h * self.q_lora_rank, "q_b": self.q_lora_rank * self.num_heads * qk}
        else:
            groups = {"q": h * self.num_heads * qk}
        groups["kv_a"] = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        groups["kv_b"] = (
            self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
        )
        groups["o"] = self.num_heads * self.v_head_dim * h
        if self.runs_indexer(layer):
            groups["indexer"] = (
                (self.q_lora_rank or h) * self.index_n_heads * self.index_head_dim
                + h * self.index_head_dim
                + h * self.index_n_heads
            )
        return groups

    def projection_format(self, name: str) -> tuple[float, str]:
        """(bytes per weight, GEMM dtype) of attention projection `name`."""
        for key, weight_bytes, dtype in self.projection_weights:
            if key == name:
                return weight_bytes, dtype
        return self.weight_bytes, self.gemm_dtype

    def attention_weight_bytes(self, layer: int) -> float:
        """Bytes of one layer's attention projections, each in its own format."""
        return sum(
            params * self.projection_format(name)[0]
            for name, params in self.attention_param_groups(layer).items()
        )

    def norm_params(self, layer: int) -> int:
        """RMSNorm (and indexer LayerNorm) weights of one layer, and its router's score bias; a
        linear-attention (KDA) layer's small non-GEMM weights instead of the attention norms."""
        n = 2 * self.hidden_size
        if self.is_linear(layer):
            inner = self.linear_num_heads * self.linear_head_dim
            # depthwise short convolutions over q, k, v (kernel taps per channel); the decay's
            # dt_bias (per channel) and A_log (per head); the gated output norm (per head dim)
            n += (
                3 * inner * self.linear_conv_kernel
                + inner
                + self.linear_num_heads
                + self.linear_head_dim
            )
        elif self.attention == "gqa":
            if self.qk_norm:
                n += (
                    2 * self.head_dim
                    if self.qk_norm_per_head
                    else (self.num_heads + self.num_kv_heads) * self.head_dim
                )
        else:
            n += self.q_lora_rank + self.kv_lora_rank
            n += 2 * self.index_head_dim if self.runs_indexer(layer) else 0
        return n + (self.num_experts if self.is_moe(layer) and self.router_bias else 0)

    def expert_params(self) -> int:
        """One routed (or shared) expert: gate, up and down projections."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def routed_expert_bytes(self) -> float:
        """The routed experts' weights of one MoE layer, in bytes as served."""
        return self.num_experts * self.expert_params() * self.weight_bytes

    def mlp_params(self, layer: int) -> int:
        """All MLP weights of a layer (every expert of an MoE layer)."""
        if not self.is_moe(layer):
            return 3 * self.hidden_size * self.intermediate_size
        return (
            self.num_experts + self.num_shared_experts
        ) * self.expert_params() + self.hidden_size * self.num_experts

    def active_mlp_params(self, layer: int) -> int:
        if not self.is_moe(layer):
            return self.mlp_params(layer)
        return (
            self.num_experts_per_tok + self.num_shared_experts
        ) * self.expert_params() + self.hidden_size * self.num_experts

    def snapshot_bytes(self, layer: int) -> float:
        """Bytes of one saved state of a linear-attention layer, as the runtime keeps it
        (models/page_layout.py): the recurrent state in fp32, the convolution's last
        taps - 1 inputs at `kv_bytes`. 0 on other layers."""
        if not self.is_linear(layer):
            return 0.0
        inner = self.linear_num_heads * self.linear_head_dim
        return (
            self.linear_num_heads * self.linear_head_dim**2 * 4
            + (self.linear_conv_kernel - 1) * 3 * inner * self.kv_bytes
        )

    def layers_snapshot_bytes(self, start: int, end: int) -> float:
        """snapshot_bytes summed over layers [start, end): one saved state of all of them."""
        return sum(self.snapshot_bytes(i) for i in range(start, end))

    def layers_kv_bytes_per_token(self, start: int, end: int) -> float:
        """kv_bytes_per_token summed over layers [start, end)."""
        return sum(self.kv_bytes_per_token(i) for i in range(start, end))

    def kv_bytes_per_token(self, layer: int) -> float:
        """Cache bytes one token adds to one layer (linear attention: a fixed state instead)."""
        if self.is_linear(layer):
            return 0.0
        if self.attention == "gqa":
            return 2 * self.num_kv_heads * self.head_dim * self.kv_bytes
        latent = (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_bytes
        if not self.runs_indexer(layer):
            return latent
        if self.index_key_bytes:
            return latent + self.index_head_dim * self.index_key_bytes
        return latent + self.index_head_dim + 4  # fp8 key + fp32 scale

    @classmethod
    def from_hf(
        cls,
        hf: dict,
        name: str = "",
        kv_bytes: float = 2.0,
        weight_bytes: float = 2.0,
        gemm_dtype: str = "bf16",
    ) -> ModelShape:
        """The shape of an HF config.json dict, read by the runtime's own parser (the model
        registry), with the cache (and indexer keys) held at `kv_bytes` per element, as the
        runtime holds them."""
        return cls.from_spec(
            parse_config(hf),
            name=name,
            kv_bytes=kv_bytes,
            weight_bytes=weight_bytes,
            gemm_dtype=gemm_dtype,
        )

    @classmethod
    def from_spec(
        cls,
        spec: ModelSpec,
        name: str = "",
        kv_bytes: float = 2.0,
        weight_bytes: float = 2.0,
        gemm_dtype: str = "bf16",
        index_key_bytes: float | None = None,
    ) -> ModelShape:
        """The shape of a model's layer specs (`wavepp.models.spec`): what the cost model
        needs of each kind. `index_key_bytes`: DSA indexer keys (default: `kv_bytes`, as the
        runtime holds them; 0: fp8 + an fp32 scale, as served)."""
        layers = spec.layers
        full = [layer.attention for layer in layers if layer.attention.kind != "kda"]
        linear = [i for i, layer in enumerate(layers) if layer.attention.kind == "kda"]
        moe = [layer.mlp for layer in layers if layer.mlp.kind == "moe"]
        dense = [i for i, layer in enumerate(layers) if layer.mlp.kind == "dense"]
        if moe and dense != list(range(len(dense))):
            raise ValueError(
                f"ModelShape: dense MLP layers {dense} are not the first layers of {spec.model_type}"
            )
        fields = dict(
            name=name or spec.model_type,
            hidden_size=spec.hidden_size,
            num_layers=spec.num_layers,
            vocab_size=spec.vocab_size,
            num_heads=full[0].num_heads if full else 1,
            weight_bytes=weight_bytes,
            gemm_dtype=gemm_dtype,
            kv_bytes=kv_bytes,
            source=f"config.json ({spec.model_type})",
        )
        if full:
            fields.update(_attention_fields(full[0], layers, kv_bytes, index_key_bytes))
        if linear:
            fields.update(_linear_fields(layers, linear))
        fields.update(_mlp_fields(layers, dense, moe))
        return cls(**fields)

    # ---- whole model -----------------------------------------------------------------------

    def num_params(self) -> int:
        layers = sum(
            self.attention_params(i) + self.mlp_params(i) + self.norm_params(i)
            for i in range(self.num_layers)
        )
        return layers + 2 * self.vocab_size * self.hidden_size + self.hidden_size

    def num_active_params(self) -> int:
        layers = sum(
            self.attention_params(i) + self.active_mlp_params(i) for i in range(self.num_layers)
        )
        return layers + 2 * self.vocab_size * self.hidden_size


def _attention_fields(attention, layers, kv_bytes: float, index_key_bytes: float | None) -> dict:
    """ModelShape's fields of the full attention's kind: GQA's heads and norms, or MLA's ranks
    and head dims and, with a DSA indexer, its shape and the layers that run it."""
    if attention.kind == "gqa":
        return dict(
            attention="gqa",
            num_kv_heads=attention.num_kv_heads,
            head_dim=attention.head_dim,
            qk_norm=attention.qk_norm != "none",
            qk_norm_per_head=attention.qk_norm == "head",
        )
    fields = dict(
        attention="mla",
        q_lora_rank=attention.q_lora_rank,
        kv_lora_rank=attention.kv_lora_rank,
        qk_nope_head_dim=attention.qk_nope_head_dim,
        qk_rope_head_dim=attention.qk_rope_head_dim,
        v_head_dim=attention.v_head_dim,
    )
    if attention.index is not None:
        fields.update(
            index_topk=attention.index.topk,
            index_n_heads=attention.index.num_heads,
            index_head_dim=attention.index.head_dim,
            index_key_bytes=kv_bytes if index_key_bytes is None else index_key_bytes,
            index_layers=tuple(
                i
                for i, layer in enumerate(layers)
                if layer.attention.kind == "mla" and layer.attention.runs_indexer
            ),
        )
    return fields


def _linear_fields(layers, linear: list[int]) -> dict:
    """ModelShape's fields of the linear-attention (KDA) layers at indices `linear`."""
    kda = layers[linear[0]].attention
    return dict(
        linear_layers=tuple(linear),
        linear_num_heads=kda.num_heads,
        linear_head_dim=kda.head_dim,
        linear_conv_kernel=kda.conv_kernel,
    )


def _mlp_fields(layers, dense: list[int], moe: list) -> dict:
    """ModelShape's MLP fields: the dense layers' width, and the MoE's experts after the
    `len(dense)` dense layers at the start."""
    fields = {}
    if dense:
        fields.update(intermediate_size=layers[dense[0]].mlp.intermediate_size)
    if moe:
        fields.update(
            first_k_dense=len(dense),
            num_experts=moe[0].num_experts,
            num_experts_per_tok=moe[0].top_k,
            num_shared_experts=moe[0].num_shared_experts,
            moe_intermediate_size=moe[0].intermediate_size,
            router_bias=moe[0].score_bias,
        )
    return fields
