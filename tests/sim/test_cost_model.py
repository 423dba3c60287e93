"""The cost model against published anchors and its own formulas.

Anchors (tolerances stated with each):
  FlashAttention-3 (Shah et al. 2024): ~740 TFLOPS FP16 forward on H100 SXM for long sequences.
  (The published system throughputs, SGLang's on H100 among them, are in
  benchmarks/public_figures.py and tests/sim/test_public_figures.py.)
  Parameter counts from the model cards: GLM-5 744B (40B active), MiniMax-M2 230B (10B),
    Kimi-K2 1.04T (32B), DeepSeek-V3 671B (37B), Kimi-Linear 48B (3B).
"""

import itertools

import pytest

from wavepp.sim import (
    HARDWARE,
    MODELS,
    ExecOverheads,
    ModelShape,
    StageCostModel,
    partition_layers,
    sparse_pairs,
    stage_kv_tokens,
    transfer_seconds,
)
from wavepp.sim.cost.stage_cost import attention_fill

NO_OVERHEAD = ExecOverheads(wave_s=0.0, chunk_s=0.0, small_kernels=False)


def test_attention_throughput_matches_flashattention3_on_h100():
    # one layer, 16 heads of 128, a 16k-token causal prefill
    m = ModelShape("fa3", 2048, 1, 1000, 16, num_kv_heads=16, head_dim=128, intermediate_size=1)
    cost = StageCostModel(m, HARDWARE["H100"], 0, 1, overheads=NO_OVERHEAD)
    n = 16384
    flops = (n * (n + 1) / 2) * 4 * 16 * 128
    seconds = cost.breakdown([(0, n)])["attention"]
    assert flops / seconds / 1e12 == pytest.approx(740, rel=0.10)


@pytest.mark.parametrize(
    "name, total, active",
    [
        ("glm-5", 744e9, 40e9),
        ("minimax-m2", 230e9, 10e9),
        ("kimi-k2", 1.04e12, 32e9),
        ("deepseek-v3", 671e9, 37e9),
        ("kimi-linear", 48e9, 3e9),
    ],
)
def test_parameter_counts_match_the_model_cards(name, total, active):
    m = MODELS[name]
    assert m.num_params() == pytest.approx(total, rel=0.03)
    # cards differ on whether embeddings count as active: within 10% (one way or the other)
    embed = 2 * m.vocab_size * m.hidden_size
    assert (
        min(abs(m.num_active_params() - active), abs(m.num_active_params() - embed - active))
        <= 0.10 * active
    )


def test_sparse_pairs_closed_form_matches_brute_force():
    for L, x, k in itertools.product((0, 5, 40, 100), (1, 7, 64), (8, 50, 2048)):
        brute = sum(min(i + 1, k) for i in range(L, L + x))
        assert sparse_pairs(L, x, k) == brute


def test_mla_prefix_reexpansion_per_cached_token_per_chunk():
    m, hw = MODELS["kimi-k2"], HARDWARE["B300"]
    cost = StageCostModel(m, hw, 5, 6, overheads=NO_OVERHEAD)
    L = 65536
    flops = 2.0 * L * m.kv_lora_rank * m.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
    eff = hw.gemm_efficiency * L / (L + hw.gemm_half_rows)
    assert cost.breakdown([(L, 1024)])["reexpansion"] == pytest.approx(
        flops / (hw.fp8_tflops * 1e12 * eff)
    )
    assert cost.breakdown([(0, 1024)])["reexpansion"] == 0.0
    # two chunks after the same prefix pay it twice
    assert cost.breakdown([(L, 512), (L, 512)])["reexpansion"] == pytest.approx(
        2 * cost.breakdown([(L, 1024)])["reexpansion"]
    )
    # DSA runs absorbed (MQA) attention: no re-expansion term at all
    glm = StageCostModel(MODELS["glm-5"], hw, 5, 6, overheads=NO_OVERHEAD)
    assert "reexpansion" not in glm.breakdown([(L, 1024)])


def test_small_waves_read_expert_weights_from_hbm():
    m, hw = MODELS["kimi-k2"], HARDWARE["B300"]
    cost = StageCostModel(m, hw, 5, 6, overheads=NO_OVERHEAD)
    T = 64
    touched = m.num_experts * (1 - (1 - m.num_experts_per_tok / m.num_experts) ** T)
    expected = touched * m.expert_params() * m.weight_bytes / (hw.hbm_tb_s * 1e12)
    assert cost.breakdown([(0, T)])["moe_routed"] == pytest.approx(expected)
    # per token, big waves are cheaper: weights amortize and per-expert GEMMs fill their tiles
    small = cost.breakdown([(0, 2048)])["moe_routed"] / 2048
    big = cost.breakdown([(0, 65536)])["moe_routed"] / 65536
    assert big < 0.5 * small


def test_dsa_attention_is_linear_in_the_prefix_beyond_topk():
    m, hw = MODELS["glm-5"], HARDWARE["B300"]
    cost = StageCostModel(m, hw, 5, 6, overheads=NO_OVERHEAD)
    a = cost.breakdown([(64 * 1024, 4096)])["attention"]
    b = cost.breakdown([(128 * 1024, 4096)])["attention"]
    dense = StageCostModel(MODELS["kimi-k2"], hw, 5, 6, overheads=NO_OVERHEAD)
    # only the indexer grows with the prefix; the sparse main attention stays at top-k keys
    assert b / a < 1.9
    # dense: the query-key pairs, at a rate a little higher over more keys a query (the ramp)
    ramp = attention_fill(hw, 64 * 1024, 4096) / attention_fill(hw, 128 * 1024, 4096)
    assert dense.breakdown([(128 * 1024, 4096)])["attention"] / dense.breakdown(
        [(64 * 1024, 4096)]
    )["attention"] == pytest.approx(
        (128 * 1024 * 4096 + 4096 * 4097 / 2) / (64 * 1024 * 4096 + 4096 * 4097 / 2) * ramp,
        rel=1e-3,
    )


def test_attention_ramps_on_its_tile_work_as_the_cudnn_sweeps_show():
    """attention_fill: k / (k + attn_half_keys) over the keys a query block runs, relative to
    the reference shape (16K causal); cuDNN's GB200 DeepSeek-V3 BF16 sweep (1,072 TF at 2K
    causal tokens against 1,678 at 16K: 0.64) within 6%; a part-full query tile pays whole."""
    gb200 = HARDWARE["GB200"]
    assert attention_fill(gb200, 0, 16384) == pytest.approx(1.0, rel=1e-4)
    assert attention_fill(gb200, 0, 2048) == pytest.approx(1072 / 1678, rel=0.06)
    # a short chunk after a long prefix runs long key loops: near the reference rate
    assert attention_fill(gb200, 32768, 128) > 0.95
    assert attention_fill(gb200, 32768, 64) == pytest.approx(
        attention_fill(gb200, 32768, 128) / 2, rel=0.01
    )


def test_tensor_parallel_divides_the_math_and_adds_collectives():
    m, hw = MODELS["kimi-k2"], HARDWARE["B300"]
    one = StageCostModel(m, hw, 5, 6, overheads=NO_OVERHEAD).breakdown([(32768, 16384)])
    eight = StageCostModel(m, hw, 5, 6, degree=8, overheads=NO_OVERHEAD).breakdown([(32768, 16384)])
    assert eight["attention"] == pytest.approx(one["attention"] / 8)
    assert "collectives" in eight and "collectives" not in one
    T, n, bw = 16384, 8, hw.link_gb_s * 1e9 / 2
    allreduce = 2 * (n - 1) / n * T * m.hidden_size * 2 / bw
    assert eight["collectives"] > allreduce


def test_transfer_is_latency_plus_bytes_over_one_link_direction():
    m, hw = MODELS["glm-5"], HARDWARE["B300"]
    assert transfer_seconds(m, hw, 8192) == pytest.approx(
        hw.link_latency_s + 8192 * m.hidden_size * 2 / (hw.link_gb_s * 1e9 / 2)
    )
    assert transfer_seconds(m, hw, 8192, internode=True) == pytest.approx(
        hw.internode_latency_s + 8192 * m.hidden_size * 2 / (hw.internode_gb_s * 1e9)
    )


@pytest.mark.parametrize("name, stages", [("minimax-m2", 4), ("kimi-k2", 8), ("glm-5", 4)])
def test_partition_covers_every_layer_and_balances_identical_layers(name, stages):
    m, hw = MODELS[name], HARDWARE["B300"]
    bounds = partition_layers(m, hw, stages)
    assert bounds[0][0] == 0 and bounds[-1][1] == m.num_layers
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 + m.first_k_dense


def test_kv_pool_is_what_hbm_leaves_after_weights():
    m, hw = MODELS["minimax-m2"], HARDWARE["B300"]
    weights = sum(m.attention_params(i) + m.mlp_params(i) for i in range(15, 30)) * m.weight_bytes
    free = 288e9 * 0.9 - weights - 16e9
    assert stage_kv_tokens(m, hw, 15, 30, first=False, last=False) == int(
        free / (15 * 2 * 8 * 128 * 2)
    )
    with pytest.raises(ValueError, match="weights per device"):
        stage_kv_tokens(MODELS["kimi-k2"], HARDWARE["H100"], 0, 61, first=True, last=True)


def test_shapes_and_specs_validate_their_fields():
    with pytest.raises(ValueError, match="attention"):
        ModelShape("x", 64, 2, 10, 4, attention="sliding")
    with pytest.raises(ValueError, match="gqa needs"):
        ModelShape("x", 64, 2, 10, 4)
    from wavepp.sim import HardwareSpec

    with pytest.raises(ValueError, match="hbm_tb_s"):
        HardwareSpec("x", 1, 1, 1, 0, 1, 0, 1, 0)
