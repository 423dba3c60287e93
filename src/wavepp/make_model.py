"""Tiny random-weight HF-format checkpoints, seeded and reproducible (tests and benchmarks).

`make_model(path, arch="llama", ...)` writes config.json + model.safetensors that transformers
and wavepp both load. Same arguments and seed give byte-identical weights.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, asdict
from pathlib import Path

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "minimax_m2", "deepseek_v3", "glm_moe_dsa", "kimi_linear")
MOE_ARCHS = ("minimax_m2", "deepseek_v3", "glm_moe_dsa")
HYBRID_ARCHS = ("kimi_linear",)   # MoE and MLA with linear-attention layers (state snapshots)


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
    # one shared expert and keep layer 0 dense
    num_experts: int = 8
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
            raise ValueError(f"arch={self.arch!r} is not supported; choose one of {SUPPORTED_ARCHS}")
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                     "intermediate_size", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be a multiple of "
                             f"num_heads={self.num_heads} (or give head_dim)")


def hf_config(spec: TinyModelSpec):
    """The transformers config object for `spec`."""
    import transformers

    if spec.arch in MOE_ARCHS + HYBRID_ARCHS:
        return _moe_hf_config(spec)
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "qwen3": transformers.Qwen3Config}[spec.arch]
    head_dim = spec.head_dim or spec.hidden_size // spec.num_heads
    kwargs = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        head_dim=head_dim, tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
    )
    if spec.arch == "llama":
        kwargs["attention_bias"] = False
    return cls(**kwargs)


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
            elif param.dim() >= 2:   # [out, in] or stacked experts [E, out, in]
                param.copy_(torch.randn(param.shape, generator=gen) / param.shape[-1] ** 0.5)
            else:
                param.copy_(0.02 * torch.randn(param.shape, generator=gen))
        for name, buffer in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):   # the routers' choice bias
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=gen))
        for name, param in sorted(model.named_parameters()):
            # KDA forget gates as the released model initializes them: decay rates exp(A_log) in
            # [1, 16], dt_bias = softplus^-1 of a step in [1e-3, 1e-1]
            if name.endswith("forget_gate.A_log"):
                param.copy_(torch.empty(param.shape).uniform_(1.0, 16.0, generator=gen).log())
            elif name.endswith("forget_gate.dt_bias"):
                dt = torch.empty(param.shape).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
                param.copy_(dt + torch.log(-torch.expm1(-dt)))
    model.save_pretrained(path)
    (path / "wavepp_spec.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return path


def _moe_hf_config(spec: TinyModelSpec):
    import transformers

    head_dim = spec.head_dim or spec.hidden_size // spec.num_heads
    common = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=spec.max_position_embeddings,
        num_experts_per_tok=spec.num_experts_per_tok, bos_token_id=None, eos_token_id=None,
    )
    if spec.arch == "minimax_m2":
        return transformers.MiniMaxM2Config(
            **common, num_key_value_heads=spec.num_kv_heads, head_dim=head_dim,
            num_local_experts=spec.num_experts, intermediate_size=spec.moe_intermediate_size,
            rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta,
                             "partial_rotary_factor": 0.5})
    mla = dict(
        num_key_value_heads=spec.num_heads, intermediate_size=spec.intermediate_size,
        moe_intermediate_size=spec.moe_intermediate_size, n_routed_experts=spec.num_experts,
        n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=spec.q_lora_rank or None,
        kv_lora_rank=spec.kv_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
        qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim, routed_scaling_factor=2.5,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
    )
    if spec.arch == "deepseek_v3":
        return transformers.DeepseekV3Config(**common, **mla, n_group=2, topk_group=1)
    if spec.arch == "kimi_linear":
        layer_types = spec.layer_types or tuple(
            "full_attention" if i % 3 == 2 else "linear_attention" for i in range(spec.num_layers))
        kimi = {k: v for k, v in mla.items() if k not in ("rope_parameters", "n_routed_experts")}
        kimi["q_lora_rank"] = None   # as released: q projected straight from the hidden state
        return transformers.KimiLinearConfig(
            **common, **kimi, num_local_experts=spec.num_experts, n_group=2, topk_group=1,
            linear_num_heads=spec.linear_num_heads, linear_head_dim=spec.linear_head_dim,
            linear_conv_kernel_dim=4, layer_types=list(layer_types), pad_token_id=None)
    indexer_types = spec.indexer_types or tuple(
        "full" if i == 0 or i % 2 else "shared" for i in range(spec.num_layers))
    return transformers.GlmMoeDsaConfig(
        **common, **mla, index_topk=spec.index_topk, index_n_heads=spec.index_n_heads,
        index_head_dim=spec.index_head_dim, indexer_types=list(indexer_types))
