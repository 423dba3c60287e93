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
term). Attention math, the router and the LM head stay in bf16, the KV cache as the model keeps it.
"""

from __future__ import annotations

from dataclasses import replace

from wavepp.sim.model_shapes import ModelShape

# format -> (bytes per weight, GEMM dtype)
WEIGHT_FORMATS: dict[str, tuple[float, str]] = {
    "bf16": (2.0, "bf16"),
    "fp8": (1.0, "fp8"),
    "nvfp4": (0.5 + 1.0 / 16, "nvfp4"),
}

NVFP4_ACTIVATION_BYTES = 0.5 + 1.0 / 16  # a quantized activation element with its share of scales


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
