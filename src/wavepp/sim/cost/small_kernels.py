"""The forward's other kernels: everything a layer runs beside its GEMMs, attention and exchange.

A real prefill forward runs tens of kernels a layer that the big ones do not count (DeepSeek's
V3 traces: about 85 a layer). Each moves a few [tokens, width] tensors through HBM and does
little math, so it costs its bytes at the HBM rate small kernels reach, and never less than a
fixed floor per launch. Per token of a layer, by what they do (widths from the model's shape;
`a`: 2 bytes, a bf16 activation):

    norms        two fused residual-add + RMSNorm passes over the hidden state (read x and
                 the residual, write both: 4 * a * hidden each); MLA's q and kv latent norms;
                 Qwen3-style q / k norms
    rope         read and write the rotary part of q (every head) and k
    kv_write     the new key / value (or latent) rows into the paged cache
    kv_build     MLA prefill in MHA form: the up-projected k_nope and v of every context token
                 (the chunk's prefix again, as `reexpansion` counts its GEMM) split and joined
                 with the shared k_pe into per-head keys and values
    quantize     each low-precision GEMM's input: FP8 per-token groups of 128 (DeepGEMM's
                 input: a kernel of its own, read bf16, write FP8 and a scale per group);
                 NVFP4 fused into the kernel before (write the 4-bit copy and its scales,
                 sim/cost/precision.py)
    activation   SiLU(gate) * up: read both halves, write one (dense MLP, each expert copy,
                 the shared experts)
    routing      the router's scores and top-k (read the fp32 logits, write ids and weights)
    permute      the routed copies into experts' order (read each token once, write k copies
                 in the dispatch format) and back (read k bf16 copies, write their weighted sum)

`layer_bytes` gives the bytes per token by kind; `SmallKernels.seconds` the time of T tokens
through one layer on one device. The constants live in sim/cost/hardware.py with their sources
(`small_kernel_bw_efficiency`, `kernel_floor_s`); `KERNELS_PER_LAYER` here.
"""

from __future__ import annotations

from wavepp.sim.cost.hardware import HardwareSpec
from wavepp.sim.cost.model_shapes import ModelShape
from wavepp.sim.cost.precision import ACTIVATION_BYTES, NVFP4_ACTIVATION_BYTES

ACT = 2.0  # bytes of a bf16 activation element
FP8_GROUP = 128  # DeepGEMM's per-token activation groups: a fp32 scale per 128 elements
FP8_SCALE_BYTES = 4.0 / FP8_GROUP  # an FP8 element's share of its group's fp32 scale
FP8_QUANT_BYTES = ACT + 1.0 + FP8_SCALE_BYTES  # read bf16, write e4m3 and its scales
# kernels a layer launches, big ones included: DeepSeek-V3's prefill traces on H800
# (deepseek-ai/profile-data) run about 85 a MoE layer; taken for every layer of every model
KERNELS_PER_LAYER = 85


def quantize_bytes(dtype: str) -> float:
    """Bytes per element of quantizing a GEMM's input for `dtype`'s tensor cores."""
    if dtype == "fp8":
        return FP8_QUANT_BYTES
    if dtype == "nvfp4":
        return NVFP4_ACTIVATION_BYTES  # fused into the kernel before: the write only
    return 0.0  # bf16 GEMMs take the activation as it is


def layer_bytes(model: ModelShape, layer: int) -> dict[str, float]:
    """HBM bytes per new token of one layer's small kernels, by kind (module docstring), on one
    device holding the whole layer. kv_build is per context token instead (`kv_build_bytes`)."""
    m, h = model, model.hidden_size
    out = {"norms": 2 * 4 * ACT * h}
    if m.is_linear(layer):
        inner = m.linear_num_heads * m.linear_head_dim
        # q, k, v: short convolution and normalization passes (read and write each)
        out["norms"] += 3 * 2 * ACT * inner
        out["quantize"] = _quantize(m, {"linear": h, "o_in": inner})
    elif m.attention == "mla":
        rope, heads = m.qk_rope_head_dim, m.num_heads
        out["norms"] += 2 * ACT * (m.q_lora_rank + m.kv_lora_rank)
        out["rope"] = 2 * ACT * (heads + 1) * rope
        out["kv_write"] = (ACT + m.kv_bytes) * (m.kv_lora_rank + rope)
        inputs = {"q_a": h, "q_b": m.q_lora_rank, "kv_b": m.kv_lora_rank, "o": heads * m.v_head_dim}
        if not m.q_lora_rank:
            inputs = {"q": h, "kv_b": m.kv_lora_rank, "o": heads * m.v_head_dim}
        out["quantize"] = _quantize(m, inputs)
    else:
        q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
        if m.qk_norm:
            out["norms"] += 2 * ACT * (q + kv)
        out["rope"] = 2 * ACT * (q + kv)
        out["kv_write"] = (ACT + m.kv_bytes) * 2 * kv
        out["quantize"] = _quantize(m, {"qkv": h, "o": q})
    if m.is_moe(layer):
        k, e, inter = m.num_experts_per_tok, m.num_experts, m.moe_intermediate_size
        copies = k + m.num_shared_experts
        # a routed copy's element as dispatched, with its share of FP8's per-group scales (which
        # the exchange's bytes, sim/cost/dp_attention.py, leave out)
        q = ACTIVATION_BYTES[m.gemm_dtype] + (FP8_SCALE_BYTES if m.gemm_dtype == "fp8" else 0.0)
        out["activation"] = copies * 3 * ACT * inter
        out["quantize"] += (h + copies * inter) * quantize_bytes(m.gemm_dtype)
        out["routing"] = 4.0 * e + 8.0 * k
        out["permute"] = q * h * (1 + k) + ACT * h * (k + 1)
    else:
        inter = m.intermediate_size
        out["activation"] = 3 * ACT * inter
        out["quantize"] += (h + inter) * quantize_bytes(m.gemm_dtype)
    return {kind: b for kind, b in out.items() if b > 0}


def kv_build_bytes(model: ModelShape, layer: int) -> float:
    """Bytes per context token of MLA's per-head key and value build (0 elsewhere): read the
    up-projection's k_nope and v, write the keys (k_nope | k_pe) and the values."""
    m = model
    if m.attention != "mla" or m.sparse_attention or m.is_linear(layer):
        return 0.0
    heads, nope, rope, v = m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    return ACT * heads * ((nope + v) + (nope + rope) + v)


def _quantize(model: ModelShape, inputs: dict[str, int]) -> float:
    """Bytes per token quantizing the inputs of the attention block's projections, each in the
    format it is served in (`ModelShape.projection_format`); an input several projections share
    (MLA's q_a and kv_a) is quantized once."""
    total = 0.0
    for name, width in inputs.items():
        fmt = model.projection_format(name)[1] if name in _PROJECTIONS else model.gemm_dtype
        total += width * quantize_bytes(fmt)
    return total


_PROJECTIONS = ("q_a", "q_b", "q", "kv_b", "o", "qkv", "linear")


class SmallKernels:
    """One layer's small kernels on one device of `hw` (module docstring). A layer's bytes are
    worked out once (a stage asks for the same few layers at every wave)."""

    def __init__(self, model: ModelShape, hw: HardwareSpec) -> None:
        self.model, self.hw = model, hw
        self._bytes: dict[int, tuple[dict[str, float], float]] = {}  # layer -> (per token, build)

    def seconds(
        self, layer: int, num_tokens: float, context_tokens: float, share: float = 1.0
    ) -> dict[str, float]:
        """Seconds by kind for `num_tokens` new tokens whose chunks attend over
        `context_tokens` in all (kv_build), a device doing `share` of the bytes (tp: 1/degree
        of all of them, norms over the hidden state included, an under-count where TP
        replicates those; 1 under dp). Each kind costs its bytes at the small kernels' HBM
        rate; `launches` is the per-launch floor of the layer's kernels."""
        hw = self.hw
        if layer not in self._bytes:
            self._bytes[layer] = (layer_bytes(self.model, layer), kv_build_bytes(self.model, layer))
        per_token, build = self._bytes[layer]
        rate = hw.hbm_bytes_s * hw.small_kernel_bw_efficiency
        out = {kind: num_tokens * b * share / rate for kind, b in per_token.items()}
        if build:
            out["kv_build"] = context_tokens * build * share / rate
        out["launches"] = KERNELS_PER_LAYER * hw.kernel_floor_s
        return out
