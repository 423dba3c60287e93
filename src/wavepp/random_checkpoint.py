"""Tiny random-weight HF-format checkpoints, seeded and reproducible (tests and benchmarks).

`make_model(path, arch="llama", ...)` writes config.json + model.safetensors that transformers
and wavepp both load. Same arguments and seed give byte-identical weights.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from wavepp.models.registry import MODEL_TYPES, family

SUPPORTED_ARCHS = MODEL_TYPES
MOE_ARCHS = (
    "minimax_m2",
    "deepseek_v3",
    "glm_moe_dsa",
    "qwen3_moe",
)  # MoE families with per-token KV only
HYBRID_ARCHS = ("kimi_linear",)  # MoE and MLA with linear-attention layers (state snapshots)


@dataclass(frozen=True)
class TinyModelSpec:
    arch: str = "llama"
    num_layers: int = 4
    hidden_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    vocab_size: int = 256
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    seed: int = 0
    # MoE families: 8 experts of width 32, top 2; DeepSeek/GLM route within 1 of 2 groups, add
    # one shared expert and keep the first `first_k_dense` layers dense (DeepSeek-V3: 3)
    num_experts: int = 8
    first_k_dense: int = 1
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 32
    # MLA (deepseek_v3, glm_moe_dsa); q_lora_rank 0: q projected straight from the hidden state
    q_lora_rank: int = 32
    kv_lora_rank: int = 16
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    # DSA indexer (glm_moe_dsa): indexer_types default to full, full, shared, full, shared, ...
    # (layer 2 shares layer 1's top-k: splitting 4 layers in 2 or 3 stages puts a boundary there)
    index_topk: int = 8
    index_n_heads: int = 2
    index_head_dim: int = 16
    indexer_types: tuple[str, ...] | None = None
    # Kimi-Linear: KDA heads of linear_head_dim, a 4-tap short convolution; layer_types default to
    # KDA everywhere but every third layer (layer 2, 5, ...), which is MLA without RoPE
    linear_num_heads: int = 4
    linear_head_dim: int = 16
    layer_types: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(
                f"arch={self.arch!r} is not supported; choose one of {SUPPORTED_ARCHS}"
            )
        for name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "vocab_size",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of "
                f"num_heads={self.num_heads} (or give head_dim)"
            )


def hf_config(spec: TinyModelSpec):
    """The transformers config object for `spec` (the family's `tiny_hf_config`)."""
    return family(spec.arch).tiny_hf_config(spec)


def make_model(path: str | Path, spec: TinyModelSpec | None = None, **overrides) -> Path:
    """Write a random-weight checkpoint for `spec` (or TinyModelSpec(**overrides)) to `path`.

    Weights are drawn with torch's generator seeded by `spec.seed`, scaled so activations stay
    O(1) through the layers (logits then differ meaningfully between tokens). Returns `path`.
    """
    import torch
    import transformers

    spec = spec or TinyModelSpec(**overrides)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = hf_config(spec)
    torch.manual_seed(spec.seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(spec.seed)
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            elif param.dim() >= 2:  # [out, in] or stacked experts [E, out, in]
                param.copy_(torch.randn(param.shape, generator=gen) / param.shape[-1] ** 0.5)
            else:
                param.copy_(0.02 * torch.randn(param.shape, generator=gen))
        for name, buffer in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):  # the routers' choice bias
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=gen))
        for name, param in sorted(model.named_parameters()):
            # KDA forget gates as the released model initializes them: decay rates exp(A_log) in
            # [1, 16], dt_bias = softplus^-1 of a step in [1e-3, 1e-1]
            if name.endswith("forget_gate.A_log"):
                param.copy_(torch.empty(param.shape).uniform_(1.0, 16.0, generator=gen).log())
            elif name.endswith("forget_gate.dt_bias"):
                dt = (
                    torch.empty(param.shape)
                    .uniform_(math.log(1e-3), math.log(1e-1), generator=gen)
                    .exp()
                )
                param.copy_(dt + torch.log(-torch.expm1(-dt)))
    model.save_pretrained(path)
    (path / "wavepp_spec.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return path
