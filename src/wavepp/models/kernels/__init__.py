"""Kernels, apart from the model code: projections (`linear`), attention over the paged cache
(`attention`, `attention_torch`), an MoE layer's routed experts (`experts`), the C++ CPU
kernels (`cpp`, sources in `csrc/`), and the per-process choice among them (`choice`:
`Kernels`, `choose_kernels`, and the CUDA path's `cuda_kernels`)."""

from wavepp.models.kernels.attention import (
    ALL_ATTENTION_KERNELS,
    ATTENTION_KERNELS,
    CUDA_ATTENTION_KERNELS,
    MIN_SHARED_PREFIX_TOKENS,
    paged_attention,
)
from wavepp.models.kernels.attention_torch import varlen_applies, varlen_operands
from wavepp.models.kernels.choice import (
    AttentionChoice,
    Kernels,
    StageKernels,
    attention_flops,
    choose_attention,
    choose_kernels,
    cpu_attention_kernels,
    cuda_kernels,
)
from wavepp.models.kernels.linear import (
    LINEAR_KERNELS,
    KernelChoice,
    choose_linear,
    linear_shapes,
    packed_available,
)

__all__ = [
    "ALL_ATTENTION_KERNELS",
    "ATTENTION_KERNELS",
    "AttentionChoice",
    "CUDA_ATTENTION_KERNELS",
    "KernelChoice",
    "Kernels",
    "LINEAR_KERNELS",
    "MIN_SHARED_PREFIX_TOKENS",
    "StageKernels",
    "attention_flops",
    "choose_attention",
    "choose_kernels",
    "choose_linear",
    "cpu_attention_kernels",
    "cuda_kernels",
    "linear_shapes",
    "packed_available",
    "paged_attention",
    "varlen_applies",
    "varlen_operands",
]
