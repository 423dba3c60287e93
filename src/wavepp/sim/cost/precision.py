"""Weight formats as served: bytes per parameter and the tensor-core math of the linear layers.

    format  bytes per weight                     GEMM math        source
    bf16    2                                    bf16             the checkpoints' own dtype
    fp8     1 (+ a scale per 128 x 128 block,    fp8 (e4m3)       DeepSeek-V3 style FP8 checkpoints
            negligible)                                           (GLM-5, MiniMax-M2, Kimi-K2 as served)
    nvfp4   0.5 + 1/16: an E2M1 value per        nvfp4 (block-    NVIDIA's NVFP4: 16-element micro-blocks,
            weight, an E4M3 scale per 16         scaled FP4 on    an E4M3 scale each and an FP32 scale per
            weights (and an FP32 scale per       both operands)   tensor ("Introducing NVFP4 for efficient
            tensor, negligible)                                   and accurate low-precision inference",
                                                                  NVIDIA technical blog, 2025)

Under nvfp4 the activations entering each linear layer are quantized to NVFP4 as well (W4A4,
as TensorRT-LLM's NVFP4 checkpoints run: the linear operators inside the transformer blocks,
weights and activations); the quantization is fused into the kernel before (norm, SwiGLU, MoE
permute), so its cost is writing the 4-bit copy and its scales (`StageCostModel`'s `quantize`
term). The router and the LM head stay in bf16.

Attention has its own precision, set apart from the weights (`with_precision`):

    attention  the tensor-core math of full attention (the chunk's queries against the cached
               keys and values): bf16, or fp8 (e4m3 Q, K and V; SGLang's and TensorRT-LLM's FP8
               context attention over an FP8 KV cache). Each hardware entry's efficiency for
               each is a kernel measurement (sim/cost/hardware.py). Linear attention stays bf16.
    kv         the KV cache's element: bf16 (2 bytes) or fp8 (1 byte, the scale per tensor
               negligible). It sets the pool's capacity and the bytes attention reads.

An NVIDIA NVFP4 checkpoint declares its KV-cache format beside its weights' (its quantization
config's `kv_cache_quant_algo`); TensorRT-LLM serves it with that cache and FP8 context attention
over it; SGLang runs FP8 attention with `--kv-cache-dtype fp8_e4m3`.
"""

from __future__ import annotations

from dataclasses import replace

from wavepp.sim.cost.model_shapes import ModelShape

# format -> (bytes per weight, GEMM dtype)
WEIGHT_FORMATS: dict[str, tuple[float, str]] = {
    "bf16": (2.0, "bf16"),
    "fp8": (1.0, "fp8"),
    "nvfp4": (0.5 + 1.0 / 16, "nvfp4"),
}

NVFP4_ACTIVATION_BYTES = 0.5 + 1.0 / 16  # a quantized activation element with its share of scales
# an activation element as a GEMM of each format takes it, sent to the experts or permuted into
# their order (DeepEP sends FP8 elements, their per-group scales not counted; NVFP4 where the
# experts run it: SGLang's GB200 part II fuses that quantization in)
ACTIVATION_BYTES = {"bf16": 2.0, "fp8": 1.0, "nvfp4": NVFP4_ACTIVATION_BYTES}

ATTENTION_DTYPES = ("bf16", "fp8")
KV_DTYPES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0}  # bytes per cached element


def with_weights(model: ModelShape, weights: str) -> ModelShape:
    """`model` served with its linear layers in `weights` (bf16 | fp8 | nvfp4); "" keeps it."""
    if not weights:
        return model
    if weights not in WEIGHT_FORMATS:
        raise ValueError(
            f"unknown weight format {weights!r}; choose one of {', '.join(WEIGHT_FORMATS)}"
        )
    weight_bytes, dtype = WEIGHT_FORMATS[weights]
    return replace(model, weight_bytes=weight_bytes, gemm_dtype=dtype)


def weight_format(model: ModelShape) -> str:
    """The format name of `model`'s linear layers."""
    for name, (weight_bytes, dtype) in WEIGHT_FORMATS.items():
        if dtype == model.gemm_dtype and weight_bytes == model.weight_bytes:
            return name
    return f"{model.gemm_dtype} at {model.weight_bytes:g} B"


def with_precision(
    model: ModelShape,
    *,
    weights: str = "",
    attention: str = "",
    kv: str = "",
    projections: dict[str, str] | None = None,
) -> ModelShape:
    """`model` with its weights, attention math and KV cache in the given formats; "" keeps
    each as it is. `projections` serves some attention projections (ModelShape
    `attention_param_groups` names, or "*" for all of them) in another weight format than the
    rest, as checkpoints do: NVIDIA's NVFP4 DeepSeek-R1 keeps its attention in BF16."""
    model = with_weights(model, weights)
    if projections:
        model = _with_projections(model, projections)
    if attention:
        if attention not in ATTENTION_DTYPES:
            choices = ", ".join(ATTENTION_DTYPES)
            raise ValueError(f"unknown attention dtype {attention!r}; choose one of {choices}")
        model = replace(model, attn_dtype=attention)
    if kv:
        if kv not in KV_DTYPES:
            raise ValueError(f"unknown KV dtype {kv!r}; choose one of {', '.join(KV_DTYPES)}")
        model = replace(model, kv_bytes=KV_DTYPES[kv])
    return model


def kv_format(model: ModelShape) -> str:
    """The name of `model`'s KV-cache element."""
    for name, size in KV_DTYPES.items():
        if size == model.kv_bytes:
            return name
    return f"{model.kv_bytes:g} B"


PROJECTION_NAMES = ("q", "q_a", "q_b", "kv_a", "kv_b", "o", "indexer", "qkv", "linear")


def _with_projections(model: ModelShape, projections: dict[str, str]) -> ModelShape:
    chosen = dict.fromkeys(PROJECTION_NAMES, projections["*"]) if "*" in projections else {}
    for name, fmt in projections.items():
        if name == "*":
            continue
        if name not in PROJECTION_NAMES:
            raise ValueError(
                f"unknown attention projection {name!r}; choose from {', '.join(PROJECTION_NAMES)}"
            )
        chosen[name] = fmt
    entries = []
    for name, fmt in chosen.items():
        if fmt not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {fmt!r} for projection {name!r}")
        entries.append((name, *WEIGHT_FORMATS[fmt]))
    return replace(model, projection_weights=tuple(entries))
