"""The attention kinds a layer can have, each declaring what it caches and what it loads.

    kind  layer                              per cached token (pool: width)     per snapshot
    gqa   grouped-query attention (Llama,    key: kv_heads * head_dim |         -
          Qwen, MiniMax-M2)                  value: kv_heads * head_dim
    mla   multi-head latent attention        latent: kv_lora_rank + rope dim    -
          (DeepSeek-V3, GLM-5, Kimi)         [+ index_key: index_head_dim, a DSA layer
                                             running its own indexer]
    kda   Kimi delta attention (linear,      -                                  recurrent:
          recurrent state)                                                      heads * dk * dv
                                                                                (fp32) | conv:
                                                                                (taps - 1) * 3qkv

Each spec is frozen and validated where it is made; `cache_pools()` and `state_pools()` are
what the page layout collects (`spec/page_layout.py`), `params()` what the loader reads
(`spec/weights.py`). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.models.spec.weights import Param, cat, one


def _positive(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{type(owner).__name__}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class GQASpec:
    """q/k/v fused into one projection. qk_norm: "none"; "head" (RMSNorm over each head,
    Qwen3); "projection" (RMSNorm over all heads at once, MiniMax-M2). RoPE rotate-half on the
    first `rotary_dim` dims of each head."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str = "none"
    kind = "gqa"
    reuses_topk = False

    def __post_init__(self) -> None:
        _positive(self, "num_heads", "num_kv_heads", "head_dim")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if not 0 < self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise ValueError(
                f"rotary_dim={self.rotary_dim} must be even and in (0, head_dim={self.head_dim}]"
            )
        if self.qk_norm not in ("none", "head", "projection"):
            raise ValueError(f"GQASpec.qk_norm {self.qk_norm!r} is not none, head or projection")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def chunk_flops(self, num_cached: int, num_tokens: int, hidden: int) -> float:
        """FLOPs of `num_tokens` new tokens after `num_cached` (the cost model, spec/layer_cost.py):
        the q | k | v and o projections, then scores and values over each token's context."""
        q, kv, x = self.q_size, self.kv_size, num_tokens
        projections = 2 * x * hidden * (2 * q + 2 * kv)
        return projections + 4 * x * q * _mean_context(num_cached, num_tokens)

    def cache_pools(self) -> tuple[tuple[str, int], ...]:
        return (("key", self.kv_size), ("value", self.kv_size))

    def state_pools(self) -> tuple:
        return ()

    def params(self, hf: str, ours: str, hidden: int) -> list[Param]:
        q, kv = self.q_size, self.kv_size
        params = [
            cat(
                ours + "qkv_proj",
                [(f"{hf}{x}_proj.weight", (n, hidden)) for x, n in zip("qkv", (q, kv, kv))],
            ),
            one(ours + "o_proj", hf + "o_proj.weight", (hidden, q)),
        ]
        if self.qkv_bias:
            params.append(
                cat(
                    ours + "qkv_bias",
                    [(f"{hf}{x}_proj.bias", (n,)) for x, n in zip("qkv", (q, kv, kv))],
                )
            )
        if self.o_bias:
            params.append(one(ours + "o_bias", hf + "o_proj.bias", (hidden,)))
        if self.qk_norm != "none":
            widths = (self.head_dim, self.head_dim) if self.qk_norm == "head" else (q, kv)
            params += [
                one(ours + "q_norm.weight", hf + "q_norm.weight", (widths[0],)),
                one(ours + "k_norm.weight", hf + "k_norm.weight", (widths[1],)),
            ]
        return params


@dataclass(frozen=True)
class IndexSpec:
    """DeepSeek sparse attention on an MLA layer: each query attends to `topk` keys. `shared`:
    this layer reuses the previous layer's selection (no indexer, no indexer keys of its own)."""

    topk: int
    num_heads: int
    head_dim: int
    shared: bool = False

    def __post_init__(self) -> None:
        _positive(self, "topk", "num_heads", "head_dim")


@dataclass(frozen=True)
class MLASpec:
    """Latent attention: a compressed latent (kv_lora_rank) and one RoPE key per token; q from
    a LoRA (q_lora_rank > 0) or straight from the hidden state (0). `rotates` False: the rope
    dims stay unrotated (Kimi-Linear). `softmax_scale` includes YaRN's factor."""

    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    softmax_scale: float
    rope_interleave: bool = True
    rotates: bool = True
    index: IndexSpec | None = None
    kind = "mla"

    def __post_init__(self) -> None:
        _positive(
            self, "num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"
        )
        if self.runs_indexer and not self.q_lora_rank:
            raise ValueError("the DSA indexer reads the q LoRA residual: q_lora_rank must be > 0")
        if self.runs_indexer and not self.qk_rope_head_dim <= self.index.head_dim:
            raise ValueError("the DSA indexer needs index_head_dim >= qk_rope_head_dim")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def runs_indexer(self) -> bool:
        """This layer computes its own top-k (and keeps indexer keys)."""
        return self.index is not None and not self.index.shared

    @property
    def reuses_topk(self) -> bool:
        """This layer attends over the top-k of the layer before it."""
        return self.index is not None and self.index.shared

    def chunk_flops(self, num_cached: int, num_tokens: int, hidden: int) -> float:
        """FLOPs of `num_tokens` new tokens after `num_cached`, in "MHA form" as layers/mla.py
        runs it: the projections, the context's latents expanded by kv_b_proj once per chunk,
        scores and values over each token's context (at most `topk` keys under DSA), and the
        indexer's own projections and scores where this layer runs one."""
        heads, rank, x = self.num_heads, self.kv_lora_rank, num_tokens
        q = hidden * self.q_lora_rank + self.q_lora_rank * heads * self.qk_head_dim
        weights = (q if self.q_lora_rank else hidden * heads * self.qk_head_dim) + hidden * (
            rank + self.qk_rope_head_dim
        )
        weights += heads * self.v_head_dim * hidden
        expand = 2 * (num_cached + x) * rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        context = _mean_context(num_cached, num_tokens)
        keys = min(context, self.index.topk) if self.index is not None else context
        flops = (
            2 * x * weights + expand + 2 * x * heads * (self.qk_head_dim + self.v_head_dim) * keys
        )
        if self.runs_indexer:
            i = self.index
            indexer = self.q_lora_rank * i.num_heads * i.head_dim + hidden * (
                i.head_dim + i.num_heads
            )
            flops += 2 * x * indexer + 2 * x * i.num_heads * i.head_dim * context
        return flops

    def cache_pools(self) -> tuple[tuple[str, int], ...]:
        latent = ("latent", self.kv_lora_rank + self.qk_rope_head_dim)
        return (latent, ("index_key", self.index.head_dim)) if self.runs_indexer else (latent,)

    def state_pools(self) -> tuple:
        return ()

    def params(self, hf: str, ours: str, hidden: int) -> list[Param]:
        heads = self.num_heads
        params = [
            one(
                ours + "kv_a_proj",
                hf + "kv_a_proj_with_mqa.weight",
                (self.kv_lora_rank + self.qk_rope_head_dim, hidden),
            ),
            one(ours + "kv_a_norm.weight", hf + "kv_a_layernorm.weight", (self.kv_lora_rank,)),
            one(
                ours + "kv_b_proj",
                hf + "kv_b_proj.weight",
                (heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank),
            ),
            one(ours + "o_proj", hf + "o_proj.weight", (hidden, heads * self.v_head_dim)),
        ]
        if self.q_lora_rank:
            params += [
                one(ours + "q_a_proj", hf + "q_a_proj.weight", (self.q_lora_rank, hidden)),
                one(ours + "q_a_norm.weight", hf + "q_a_layernorm.weight", (self.q_lora_rank,)),
                one(
                    ours + "q_b_proj",
                    hf + "q_b_proj.weight",
                    (heads * self.qk_head_dim, self.q_lora_rank),
                ),
            ]
        else:
            params.append(
                one(ours + "q_proj", hf + "q_proj.weight", (heads * self.qk_head_dim, hidden))
            )
        if self.runs_indexer:
            i, o, dim = hf + "indexer.", ours + "indexer.", self.index.head_dim
            params += [
                one(o + "wq_b", i + "wq_b.weight", (self.index.num_heads * dim, self.q_lora_rank)),
                one(o + "wk", i + "wk.weight", (dim, hidden)),
                one(o + "k_norm_weight", i + "k_norm.weight", (dim,)),
                one(o + "k_norm_bias", i + "k_norm.bias", (dim,)),
                one(
                    o + "weights_proj",
                    i + "weights_proj.weight",
                    (self.index.num_heads, hidden),
                    fp32=True,
                ),
            ]
        return params


@dataclass(frozen=True)
class KDASpec:
    """Kimi delta attention: `num_heads` heads of `head_dim` (dk = dv), a short causal
    convolution of `conv_kernel` taps over q, k, v, a per-channel decay gate."""

    num_heads: int
    head_dim: int
    conv_kernel: int
    norm_eps: float
    kind = "kda"
    reuses_topk = False

    def __post_init__(self) -> None:
        _positive(self, "num_heads", "head_dim", "conv_kernel")

    @property
    def qkv_size(self) -> int:
        return self.num_heads * self.head_dim

    def chunk_flops(self, num_cached: int, num_tokens: int, hidden: int) -> float:
        """FLOPs of `num_tokens` new tokens (a state, so `num_cached` costs nothing): q | k | v,
        the low-rank decay and output gates, beta and o; then the chunked scan
        (layers/kda_scan.py, chunks of 64: about 10 * 64 * d + 4 * d^2 per token and head)."""
        heads, d, qkv, x = self.num_heads, self.head_dim, self.qkv_size, num_tokens
        weights = 3 * hidden * qkv + 2 * (hidden * d + d * qkv) + hidden * heads + qkv * hidden
        return 2 * x * weights + x * heads * (10 * 64 * d + 4 * d * d)

    def cache_pools(self) -> tuple:
        return ()

    def state_pools(self) -> tuple[tuple[str, int, bool], ...]:
        """(name, elements, fp32) of one snapshot of this layer."""
        return (
            ("recurrent", self.num_heads * self.head_dim**2, True),
            ("conv", (self.conv_kernel - 1) * 3 * self.qkv_size, False),
        )

    def params(self, hf: str, ours: str, hidden: int) -> list[Param]:
        heads, d, qkv = self.num_heads, self.head_dim, self.qkv_size
        params = [
            cat(ours + "qkv_proj", [(f"{hf}{x}_proj.weight", (qkv, hidden)) for x in "qkv"]),
            # conv_weight: [3 * qkv, taps], channels in q | k | v order as qkv_proj's rows
            Param(
                ours + "conv_weight",
                tuple((f"{hf}{x}_conv1d.weight", (qkv, 1, self.conv_kernel)) for x in "qkv"),
                "conv",
            ),
            Param(ours + "A_log", ((hf + "A_log", (1, 1, heads, 1)),), "flatten"),
            one(ours + "dt_bias", hf + "dt_bias", (qkv,), fp32=True),
            one(ours + "o_norm_weight", hf + "o_norm.weight", (d,)),
        ]
        shapes = {
            "f_a_proj": (d, hidden),
            "f_b_proj": (qkv, d),
            "b_proj": (heads, hidden),
            "g_a_proj": (d, hidden),
            "g_b_proj": (qkv, d),
            "o_proj": (hidden, qkv),
        }
        return params + [
            one(ours + name, f"{hf}{name}.weight", shape) for name, shape in shapes.items()
        ]


AttentionSpec = GQASpec | MLASpec | KDASpec


def _mean_context(num_cached: int, num_tokens: int) -> float:
    """The keys a new token attends to, on average over a causal chunk: the cached ones and
    half of its own chunk."""
    return num_cached + (num_tokens + 1) / 2
