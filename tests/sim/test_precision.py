"""NVFP4 weights in the cost model (sim/cost/precision.py, sim/cost/hardware.py,
sim/cost/stage_cost.py)."""

import pytest

from wavepp.sim import HARDWARE, MODELS, StageCostModel
from wavepp.sim.cost.precision import WEIGHT_FORMATS, weight_format, with_weights
from wavepp.sim.cost.small_kernels import layer_bytes
from wavepp.sim.cost.stage_cost import ExecOverheads


def test_nvfp4_weights_hold_a_scale_per_sixteen_values():
    m = with_weights(MODELS["minimax-m2"], "nvfp4")
    assert m.weight_bytes == 0.5625 and m.gemm_dtype == "nvfp4"
    assert weight_format(m) == "nvfp4" and weight_format(MODELS["minimax-m2"]) == "fp8"
    assert with_weights(m, "") is m
    with pytest.raises(ValueError, match="unknown weight format"):
        with_weights(m, "int4")
    assert set(WEIGHT_FORMATS) == {"bf16", "fp8", "nvfp4"}


def test_b300_runs_nvfp4_at_its_datasheet_peak_and_hopper_has_none():
    assert HARDWARE["B300"].peak_flops("nvfp4") == 13.5e15
    assert HARDWARE["B200"].peak_flops("nvfp4") == 9e15
    with pytest.raises(ValueError, match="no FP4 tensor cores"):
        HARDWARE["H100"].peak_flops("nvfp4")


def test_a_large_nvfp4_gemm_runs_at_the_measured_efficiency():
    """A dense layer's MLP on many rows: FLOPs over (FP4 peak x 0.43 x tile fill)."""
    hw = HARDWARE["B300"]
    m = with_weights(MODELS["glm-5"], "nvfp4")
    none = ExecOverheads(wave_s=0.0, chunk_s=0.0, small_kernels=False)
    stage = StageCostModel(m, hw, 0, 1, overheads=none)  # layer 0: a dense MLP
    T = 16384
    got = stage.breakdown([(0, T)])["mlp"]
    eff = 0.43 * T / (T + hw.gemm_half_rows)
    assert got == pytest.approx(2.0 * T * m.mlp_params(0) / (13.5e15 * eff), rel=1e-12)
    # the activations entering each GEMM are written again in 4 bits with their scales: the
    # attention block's (q_a and kv_a share theirs), q_b's, kv_b's, o's, and the MLP's two
    q = layer_bytes(m, 0)["quantize"]
    elems = (
        m.hidden_size
        + m.q_lora_rank
        + m.kv_lora_rank
        + m.num_heads * m.v_head_dim
        + m.hidden_size
        + m.intermediate_size
    )
    assert q == pytest.approx(elems * 0.5625, rel=1e-12)


def test_nvfp4_makes_the_paper_models_faster_but_not_their_attention():
    hw = HARDWARE["B300"]
    for name in ("glm-5", "minimax-m2"):
        fp8 = StageCostModel(MODELS[name], hw, 10, 20).breakdown([(28672, 4096)])
        fp4 = StageCostModel(with_weights(MODELS[name], "nvfp4"), hw, 10, 20).breakdown(
            [(28672, 4096)]
        )
        assert fp4["moe_routed"] < 0.7 * fp8["moe_routed"]
        assert fp4["attention"] == fp8["attention"]


def test_attention_and_kv_precision_are_part_of_a_setup():
    from wavepp.sim.cost.precision import kv_format, with_precision

    base = MODELS["glm-5"]
    m = with_precision(base, weights="nvfp4", attention="fp8", kv="fp8")
    assert (weight_format(m), m.attn_dtype, kv_format(m)) == ("nvfp4", "fp8", "fp8")
    assert (base.attn_dtype, kv_format(base)) == ("bf16", "bf16")
    assert with_precision(base) == base
    with pytest.raises(ValueError, match="unknown attention dtype"):
        with_precision(base, attention="fp4")
    with pytest.raises(ValueError, match="unknown KV dtype"):
        with_precision(base, kv="int8")


def test_fp8_attention_runs_at_the_fp8_peak_times_its_own_efficiency():
    """A long chunk's attention on GB300: bf16 at 2.5 PF x 0.82, fp8 at 5 PF x 0.68 (the cuDNN
    measurements sim/cost/hardware.py cites); an FP8 KV cache halves the bytes a decode-like short
    chunk over a long cache reads."""
    hw = HARDWARE["GB300"]
    none = ExecOverheads(wave_s=0.0, chunk_s=0.0, small_kernels=False)
    from wavepp.sim.cost.precision import with_precision

    bf16 = StageCostModel(MODELS["minimax-m2"], hw, 5, 6, overheads=none)
    fp8 = StageCostModel(
        with_precision(MODELS["minimax-m2"], attention="fp8"), hw, 5, 6, overheads=none
    )
    chunk = [(28672, 4096)]
    ratio = bf16.breakdown(chunk)["attention"] / fp8.breakdown(chunk)["attention"]
    assert ratio == pytest.approx((5000 * 0.68) / (2500 * 0.82), rel=1e-9)
    # one query of one head over a long cache is bound by reading it: fp8 elements halve that
    from wavepp.sim import ModelShape

    one = ModelShape(
        "one-head", 1024, 1, 1000, 1, num_kv_heads=1, head_dim=128, intermediate_size=1
    )
    tiny = [(262144, 1)]
    read = StageCostModel(one, hw, 0, 1, overheads=none).breakdown(tiny)["attention"]
    assert read == pytest.approx(262145 * 2 * 128 * 2 / hw.hbm_bytes_s, rel=1e-9)
    half = StageCostModel(with_precision(one, kv="fp8"), hw, 0, 1, overheads=none)
    assert half.breakdown(tiny)["attention"] == pytest.approx(read / 2, rel=1e-9)


def test_an_fp8_kv_cache_holds_twice_the_tokens():
    from wavepp.sim import stage_kv_tokens
    from wavepp.sim.cost.precision import with_precision

    hw, base = HARDWARE["B300"], MODELS["minimax-m2"]
    fp8 = with_precision(base, kv="fp8")
    a = stage_kv_tokens(base, hw, 10, 20, first=False, last=False)
    b = stage_kv_tokens(fp8, hw, 10, 20, first=False, last=False)
    assert b == pytest.approx(2 * a, rel=1e-6)


def test_attention_projections_can_keep_another_format_than_the_experts():
    """NVIDIA's NVFP4 DeepSeek-R1 keeps its attention in BF16: the projections then cost BF16
    GEMM time and BF16 bytes, the experts NVFP4, and only the NVFP4 GEMMs' inputs are quantized."""
    from wavepp.sim.cost.precision import with_precision
    from wavepp.sim.cost.stages import stage_weight_bytes

    hw = HARDWARE["GB300"]
    none = ExecOverheads(wave_s=0.0, chunk_s=0.0, small_kernels=False)
    ds = MODELS["deepseek-v3"]
    all4 = with_precision(ds, weights="nvfp4")
    mixed = with_precision(ds, weights="nvfp4", projections={"*": "bf16"})
    only_o = with_precision(ds, weights="nvfp4", projections={"*": "bf16", "o": "nvfp4"})
    T = 16384
    p4 = StageCostModel(all4, hw, 5, 6, overheads=none).breakdown([(0, T)])
    pb = StageCostModel(mixed, hw, 5, 6, overheads=none).breakdown([(0, T)])
    eff = lambda e: e * T / (T + hw.gemm_half_rows)  # noqa: E731
    params = ds.attention_params(5)
    assert pb["projections"] == pytest.approx(2 * T * params / (2.5e15 * eff(0.70)), rel=1e-9)
    assert p4["projections"] == pytest.approx(2 * T * params / (15e15 * eff(0.43)), rel=1e-9)
    assert pb["moe_routed"] == p4["moe_routed"]
    # the MLP's inputs are quantized in both; the attention block's only where it runs NVFP4
    inner = ds.num_heads * ds.v_head_dim
    nvfp4_bytes = 0.5625  # a quantized element with its share of scales
    attention_inputs = ds.hidden_size + ds.q_lora_rank + ds.kv_lora_rank + inner
    q4, qb = layer_bytes(all4, 5)["quantize"], layer_bytes(mixed, 5)["quantize"]
    assert q4 - qb == pytest.approx(attention_inputs * nvfp4_bytes, rel=1e-9)
    assert layer_bytes(only_o, 5)["quantize"] - qb == pytest.approx(inner * nvfp4_bytes, rel=1e-9)
    # weights in memory: the attention block in bf16 instead of 0.5625 bytes
    a = stage_weight_bytes(all4, 5, 6, first=False, last=False)
    b = stage_weight_bytes(mixed, 5, 6, first=False, last=False)
    assert b - a == pytest.approx(params * (2.0 - 0.5625))
    with pytest.raises(ValueError, match="unknown attention projection"):
        with_precision(ds, projections={"wq": "bf16"})
