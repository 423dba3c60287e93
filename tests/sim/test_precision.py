"""NVFP4 weights in the cost model (sim/precision.py, sim/hardware.py, sim/cost.py)."""

import pytest

from wavepp.sim import HARDWARE, MODELS, StageCostModel
from wavepp.sim.cost import ExecOverheads
from wavepp.sim.precision import WEIGHT_FORMATS, weight_format, with_weights


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
    none = ExecOverheads(wave_s=0.0, chunk_s=0.0, elementwise_hidden_passes=0.0)
    stage = StageCostModel(m, hw, 0, 1, overheads=none)  # layer 0: a dense MLP
    T = 16384
    got = stage.breakdown([(0, T)])["mlp"]
    eff = 0.43 * T / (T + hw.gemm_half_rows)
    assert got == pytest.approx(2.0 * T * m.mlp_params(0) / (13.5e15 * eff), rel=1e-12)
    # the activations entering each GEMM are written again in 4 bits with their scales
    q = stage.breakdown([(0, T)])["quantize"]
    elems = m.hidden_size + m.num_heads * m.v_head_dim + m.hidden_size + m.intermediate_size
    assert q == pytest.approx(T * elems * 0.5625 / hw.hbm_bytes_s, rel=1e-12)


def test_nvfp4_makes_the_paper_models_faster_but_not_their_attention():
    hw = HARDWARE["B300"]
    for name in ("glm-5", "minimax-m2"):
        fp8 = StageCostModel(MODELS[name], hw, 10, 20).breakdown([(28672, 4096)])
        fp4 = StageCostModel(with_weights(MODELS[name], "nvfp4"), hw, 10, 20).breakdown(
            [(28672, 4096)]
        )
        assert fp4["moe_routed"] < 0.7 * fp8["moe_routed"]
        assert fp4["attention"] == fp8["attention"]
