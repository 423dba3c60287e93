"""The forward's small kernels (sim/cost/small_kernels.py): their bytes by what they do, and their
time against the one published breakdown of a real prefill forward that names them."""

import pytest

from wavepp.sim import HARDWARE, MODELS
from wavepp.sim.cost.precision import with_precision
from wavepp.sim.cost.small_kernels import (
    FP8_QUANT_BYTES,
    SmallKernels,
    kv_build_bytes,
    layer_bytes,
)


def test_deepseek_v3_on_h100_costs_what_the_published_breakdown_shows():
    """DeepSeek-V3 FP8, 16,384 tokens a device (4,096-token prompts), one MoE layer on H100:
    SGLang's breakdown of a prefill layer (LMSYS blog 2025-05-05, "Prefill Time Breakdown")
    shows 5.1 ms of "other kernels" in DeepSeek's own H800 profile and 6.2 ms in SGLang's.
    Nothing in the model is fitted to either: the bytes come from the shapes."""
    m, hw = MODELS["deepseek-v3"], HARDWARE["H100"]
    tokens = 16384  # 4 cold prompts of 4,096: each chunk's context is its own tokens
    per_layer = sum(SmallKernels(m, hw).seconds(5, tokens, tokens, 1.0).values())
    assert 5.1e-3 * 0.85 < per_layer < 6.2e-3 * 1.15
    # the key and value build runs over a chunk's whole context: after a prefix of 28K the
    # same 4K tokens build 32K tokens' keys and values
    cold = SmallKernels(m, hw).seconds(5, 4096, 4096, 1.0)["kv_build"]
    warm = SmallKernels(m, hw).seconds(5, 4096, 32768, 1.0)["kv_build"]
    assert warm == pytest.approx(8 * cold)
    assert cold == pytest.approx(
        4096 * kv_build_bytes(m, 5) / (hw.hbm_bytes_s * hw.small_kernel_bw_efficiency)
    )


def test_bytes_follow_the_formats_and_the_layer_kind():
    ds = MODELS["deepseek-v3"]  # FP8: every GEMM input quantized by a kernel of its own
    moe, dense = layer_bytes(ds, 5), layer_bytes(ds, 0)
    assert {"permute", "routing"} <= moe.keys() and not {"permute", "routing"} & dense.keys()
    inputs = ds.hidden_size + ds.q_lora_rank + ds.kv_lora_rank + ds.num_heads * ds.v_head_dim
    copies = ds.num_experts_per_tok + ds.num_shared_experts
    expected = inputs + ds.hidden_size + copies * ds.moe_intermediate_size
    assert moe["quantize"] == pytest.approx(expected * FP8_QUANT_BYTES)
    # the permutes: each token read once and written k times as dispatched (FP8 and its scales),
    # then k bf16 copies read back and summed into one
    h, k = ds.hidden_size, ds.num_experts_per_tok
    assert moe["permute"] == pytest.approx((1 + 4 / 128) * h * (1 + k) + 2 * h * (k + 1))
    # a BF16 model quantizes nothing
    bf16 = with_precision(ds, weights="bf16", projections={"*": "bf16"})
    assert "quantize" not in layer_bytes(bf16, 5)
    # MLA builds per-head keys and values; GQA and sparse (absorbed) MLA do not
    assert kv_build_bytes(ds, 5) > 0
    assert kv_build_bytes(MODELS["minimax-m2"], 5) == 0 == kv_build_bytes(MODELS["glm-5"], 5)
    # GQA writes K and V rows of its KV heads into the cache
    mm = MODELS["minimax-m2"]
    assert layer_bytes(mm, 5)["kv_write"] == (2 + mm.kv_bytes) * 2 * mm.num_kv_heads * mm.head_dim


def test_time_is_bytes_at_the_small_kernels_rate_plus_a_gap_a_launch():
    m, hw = MODELS["minimax-m2"], HARDWARE["B300"]
    small = SmallKernels(m, hw)
    one, two = small.seconds(5, 8192, 8192), small.seconds(5, 16384, 16384)
    assert one["launches"] == two["launches"] > 0  # per launch, not per token
    for kind in one.keys() - {"launches"}:
        assert two[kind] == pytest.approx(2 * one[kind]), kind
    assert small.seconds(5, 8192, 8192, share=0.5)["norms"] == pytest.approx(one["norms"] / 2)
