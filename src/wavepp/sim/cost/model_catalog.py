"""The models the simulator knows by name: each `ModelShape` from its released config.json
(the source named on each), and `get_model`. The shape's arithmetic is in model_shapes.py."""

from __future__ import annotations

from wavepp.sim.cost.model_shapes import ModelShape

MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        # zai-org/GLM-5 config.json (GlmMoeDsaForCausalLM, 744B total / 40B active): 78 layers,
        # hidden 6144, 64 heads, q_lora 2048, kv_lora 512, qk nope 192 + rope 64, v 256, DSA
        # indexer 32 heads x 128, top-2048 keys; 256 experts top-8 + 1 shared, expert FFN 2048,
        # first 3 layers dense (FFN 12288); vocab 154880. Values as in NVIDIA NeMo AutoModel's
        # GlmMoeDsaConfig and the released config's layer counts; served in FP8.
        ModelShape(
            "glm-5",
            6144,
            78,
            154880,
            64,
            attention="mla",
            q_lora_rank=2048,
            kv_lora_rank=512,
            qk_nope_head_dim=192,
            qk_rope_head_dim=64,
            v_head_dim=256,
            index_topk=2048,
            index_n_heads=32,
            index_head_dim=128,
            intermediate_size=12288,
            first_k_dense=3,
            num_experts=256,
            num_experts_per_tok=8,
            num_shared_experts=1,
            moe_intermediate_size=2048,
            source="zai-org/GLM-5 config.json",
        ),
        # MiniMaxAI/MiniMax-M2 config.json (230B / 10B active): 62 layers, hidden 3072, 48 query
        # heads, 8 KV heads, head_dim 128, full attention in every layer; 256 experts top-8, no
        # shared expert, expert FFN 1536; vocab 200064; FP8 weights.
        ModelShape(
            "minimax-m2",
            3072,
            62,
            200064,
            48,
            attention="gqa",
            num_kv_heads=8,
            head_dim=128,
            num_experts=256,
            num_experts_per_tok=8,
            moe_intermediate_size=1536,
            source="MiniMaxAI/MiniMax-M2 config.json",
        ),
        # moonshotai/Kimi-K2-Instruct config.json (DeepSeek-V3 architecture, 1T / 32B active):
        # 61 layers, hidden 7168, 64 heads, q_lora 1536, kv_lora 512, qk nope 128 + rope 64, v 128;
        # 384 experts top-8 + 1 shared, expert FFN 2048, first layer dense (FFN 18432); vocab 163840.
        ModelShape(
            "kimi-k2",
            7168,
            61,
            163840,
            64,
            attention="mla",
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            intermediate_size=18432,
            first_k_dense=1,
            num_experts=384,
            num_experts_per_tok=8,
            num_shared_experts=1,
            moe_intermediate_size=2048,
            source="moonshotai/Kimi-K2-Instruct config.json",
        ),
        # moonshotai/Kimi-Linear-48B-A3B-Instruct config.json: 27 layers, hidden 2304; KDA (linear)
        # attention in 1-based layers 1-3,5-7,...,25-26 (32 heads x 128), MLA (no q_lora,
        # kv_lora 512, nope 128 + rope 64, v 128, 32 heads) in 4,8,...,24,27; 256 experts top-8
        # + 1 shared, expert FFN 1024, first layer dense (FFN 9216); vocab 163840; bf16 weights.
        ModelShape(
            "kimi-linear",
            2304,
            27,
            163840,
            32,
            attention="mla",
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            linear_layers=tuple(i - 1 for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)),
            linear_num_heads=32,
            linear_head_dim=128,
            intermediate_size=9216,
            first_k_dense=1,
            num_experts=256,
            num_experts_per_tok=8,
            num_shared_experts=1,
            moe_intermediate_size=1024,
            weight_bytes=2.0,
            gemm_dtype="bf16",
            source="moonshotai/Kimi-Linear-48B-A3B-Instruct config.json",
        ),
        # A Kimi K3-class hybrid (the paper's 2.8T MoE with MLA and Kimi Delta Attention; no config
        # is public): Kimi-K2's widths (hidden 7168, MLA 64 heads, q_lora 1536, kv_lora 512, nope 128
        # + rope 64, v 128; 1 shared expert, expert FFN 2048, top-8; first layer dense, FFN 18432;
        # vocab 163840) over 61 layers in Kimi-Linear's pattern: MLA in every 4th layer and the last
        # (1-based 4, 8, ..., 60, 61: 16 layers), KDA in the other 45, with K2's 64 heads x 128
        # (Kimi-Linear: 32 x 128 at hidden 2304); routed experts scaled from K2's 384 to 1,052, which
        # brings the total to 2.80T (39B active). Served in NVFP4 (1.58 TB of weights: FP8's 2.8 TB
        # would not fit 8 x 288 GB).
        ModelShape(
            "kimi-k3",
            7168,
            61,
            163840,
            64,
            attention="mla",
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            linear_layers=tuple(i for i in range(61) if (i + 1) % 4 and i != 60),
            linear_num_heads=64,
            linear_head_dim=128,
            intermediate_size=18432,
            first_k_dense=1,
            num_experts=1052,
            num_experts_per_tok=8,
            num_shared_experts=1,
            moe_intermediate_size=2048,
            weight_bytes=0.5625,
            gemm_dtype="nvfp4",
            source="Kimi-K2-Instruct widths, Kimi-Linear-48B-A3B layer pattern, experts to 2.8T",
        ),
        # Qwen/Qwen3-235B-A22B config.json (Qwen3MoeForCausalLM, 235B / 22B active), read by the
        # runtime's own parser: 94 layers, hidden 4096, 64 query heads, 4 KV heads, head_dim 128,
        # per-head q/k RMSNorm; 128 experts top-8 (softmax router, renormalized), expert FFN 1536,
        # no shared expert, no dense layer; vocab 151936; served in FP8 (Qwen3-235B-A22B-FP8).
        ModelShape.from_hf(
            {
                "architectures": ["Qwen3MoeForCausalLM"],
                "model_type": "qwen3_moe",
                "vocab_size": 151936,
                "hidden_size": 4096,
                "intermediate_size": 12288,
                "num_hidden_layers": 94,
                "num_attention_heads": 64,
                "num_key_value_heads": 4,
                "head_dim": 128,
                "num_experts": 128,
                "num_experts_per_tok": 8,
                "moe_intermediate_size": 1536,
                "norm_topk_prob": True,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0,
                "max_position_embeddings": 40960,
                "tie_word_embeddings": False,
            },
            name="qwen3-235b",
            weight_bytes=1.0,
            gemm_dtype="fp8",
        ),
        # meta-llama/Llama-3.1-405B config.json (dense): 126 layers, hidden 16384, 128 query
        # heads, 8 KV heads, head_dim 128, MLP 53248; vocab 128256; released in BF16. Used for
        # Meta's published prefill times (benchmarks/public_figures.py).
        ModelShape(
            "llama-3.1-405b",
            16384,
            126,
            128256,
            128,
            attention="gqa",
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=53248,
            weight_bytes=2.0,
            gemm_dtype="bf16",
            source="meta-llama/Llama-3.1-405B config.json",
        ),
        # deepseek-ai/DeepSeek-V3 config.json (671B / 37B active): 61 layers, hidden 7168, 128 heads,
        # q_lora 1536, kv_lora 512, nope 128 + rope 64, v 128; 256 experts top-8 + 1 shared, FFN
        # 2048, first 3 layers dense (18432); vocab 129280; FP8. Used for the published anchor.
        ModelShape(
            "deepseek-v3",
            7168,
            61,
            129280,
            128,
            attention="mla",
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            intermediate_size=18432,
            first_k_dense=3,
            num_experts=256,
            num_experts_per_tok=8,
            num_shared_experts=1,
            moe_intermediate_size=2048,
            source="deepseek-ai/DeepSeek-V3 config.json",
        ),
    )
}


def get_model(name: str) -> ModelShape:
    key = name.lower()
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[key]
