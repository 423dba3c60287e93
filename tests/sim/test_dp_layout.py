"""Data-parallel attention with expert parallelism (`dp-ep`), GB200, and the fixed budgets
(`SimSetup.budget_tokens`, `--budget-tokens`)."""

import json

import pytest

from wavepp.sim import HARDWARE, MODELS, ExecOverheads, StageCostModel
from wavepp.sim.cost.execution import COMM_SMS, Execution
from wavepp.sim.cost.expert_balance import balancedness
from wavepp.sim.cost.precision import with_precision
from wavepp.sim.cost.stages import stage_kv_tokens, stage_weight_bytes
from wavepp.sim.studies.scenario import SimSetup, build_system, fixed_budget, run_setting
from wavepp.sim.studies.systems import BUDGETED, get_system
from wavepp.workloads import WorkloadOptions, workload_from_options

NONE = ExecOverheads(wave_s=0.0, chunk_s=0.0, small_kernels=False)
BALANCED = Execution(placement="perfect")  # experts evenly loaded: the exchange's own formula


def cold_prompts(setup, num_requests, real_tokens):
    """`num_requests` cold prompts of `real_tokens` at `setup`'s token scale."""
    return workload_from_options(
        "cold",
        WorkloadOptions(
            num_requests=num_requests,
            prompt_len=setup.sim_tokens(real_tokens),
            prefix_len=0,
            suffix_len=0,
            common={"block_size": setup.block_size, "seed": 0},
        ),
    )


def _stage(model, hw, degree, layout, nodes=1, execution=BALANCED):
    return StageCostModel(
        model,
        HARDWARE[hw],
        5,
        6,
        degree=degree,
        num_nodes=nodes,
        layout=layout,
        overheads=NONE,
        execution=execution,
    )


def test_gb200_is_its_datasheet():
    hw = HARDWARE["GB200"]
    assert (hw.bf16_tflops, hw.fp8_tflops, hw.nvfp4_tflops) == (2500, 5000, 10000)
    assert (hw.hbm_gb, hw.hbm_tb_s, hw.link_gb_s, hw.internode_gb_s) == (186, 8, 1800, 50)
    assert hw.host_link_gb_s == 900


def test_dp_attention_exchanges_only_the_experts_tokens():
    """dp: no all-reduce and no all-gather; each token goes once to each other device holding
    one of its k experts (probability 1 - (1 - 1/n)^k), FP8 out and bf16 back."""
    m, hw = MODELS["deepseek-v3"], HARDWARE["B300"]
    T, n, k = 16384, 8, m.num_experts_per_tok
    even = [(0, T // n)] * n  # a chunk per device
    dp = _stage(m, "B300", n, "dp").breakdown(even)
    tp = _stage(m, "B300", n, "tp").breakdown(even)
    copies = (n - 1) * (1 - (1 - 1 / n) ** k)
    expected = copies * T / n * m.hidden_size * 3.0 / hw.link_bytes_s + 2 * hw.link_latency_s
    assert dp["collectives"] == pytest.approx(expected, rel=1e-9)
    assert dp["collectives"] < tp["collectives"] / 2
    # every device's tokens through the experts, split over the devices, as under tp
    assert dp["moe_routed"] == pytest.approx(tp["moe_routed"], rel=1e-9)
    # a dense layer exchanges nothing under dp
    first = StageCostModel(m, hw, 0, 1, degree=n, layout="dp", overheads=NONE, execution=BALANCED)
    assert "collectives" not in first.breakdown(even)


def test_across_nodes_the_nic_carries_a_token_once_per_node():
    """DeepEP's normal kernels: one copy per other node over the NIC, forwarded inside it."""
    m, hw = MODELS["deepseek-v3"], HARDWARE["H100"]
    T, n, nodes, k = 524288, 32, 4, m.num_experts_per_tok
    even = [(0, T // n)] * n
    got = _stage(m, "H100", n, "dp", nodes=nodes).breakdown(even)["collectives"]
    per_copy = T / n * m.hidden_size * 3.0
    nic = (nodes - 1) * (1 - (1 - 1 / nodes) ** k) * per_copy / hw.internode_bytes_s
    assert got == pytest.approx(nic + 2 * hw.internode_latency_s, rel=1e-9)


def test_dp_runs_each_chunk_on_one_device_and_waits_for_the_busiest():
    m = with_precision(MODELS["deepseek-v3"], weights="nvfp4")
    n = 4
    group = _stage(m, "GB300", n, "dp")
    one = _stage(m, "GB300", 1, "tp")
    # even chunks: each device runs its own through the whole attention block and shared
    # expert, as one device alone does
    even = group.breakdown([(0, 4096)] * n)
    alone = one.breakdown([(0, 4096)])
    for term in ("projections", "attention", "moe_shared", "router"):
        assert even[term] == pytest.approx(alone[term], rel=1e-9), term
    # a single long chunk is not split over the devices (no context parallelism)
    long = group.breakdown([(0, 16384)])
    assert long["attention"] == pytest.approx(one.breakdown([(0, 16384)])["attention"], rel=1e-9)
    # uneven chunks: the longest goes alone, the rest share the other devices; the wave pays
    # the busiest device
    mixed = group.breakdown([(0, 16384), (0, 2048), (0, 2048), (0, 2048), (0, 2048)])
    assert mixed["attention"] == pytest.approx(long["attention"], rel=1e-9)


def test_dp_keeps_every_weight_but_the_experts_on_each_device():
    m = with_precision(MODELS["deepseek-v3"], weights="nvfp4")
    n = 4
    full = stage_weight_bytes(m, 5, 6, first=False, last=False)
    tp = stage_weight_bytes(m, 5, 6, first=False, last=False, degree=n)
    dpw = stage_weight_bytes(m, 5, 6, first=False, last=False, degree=n, layout="dp")
    routed = m.num_experts * m.expert_params() * m.weight_bytes
    assert dpw == pytest.approx(full - routed * (1 - 1 / n))
    assert tp == pytest.approx(full / n) and dpw > tp
    # each device holds its own requests' KV: the group's pool grows with the devices
    hw = HARDWARE["GB300"]
    pool = stage_kv_tokens(m, hw, 0, 61, first=True, last=True, degree=n, layout="dp")
    tp_pool = stage_kv_tokens(m, hw, 0, 61, first=True, last=True, degree=n)
    assert pool > 2 * tp_pool


def test_dp_ep_gives_a_request_at_most_one_devices_budget_per_wave():
    """The planner caps a request's chunk at the per-device budget, so a lone long prompt runs
    on one device, chunk after chunk, while the others idle."""
    setup = SimSetup(with_precision(MODELS["deepseek-v3"], weights="nvfp4"), HARDWARE["GB300"], 2)
    workload = cold_prompts(setup, 2, 65536)
    lone, _ = run_setting("dp-ep", setup, workload, 1)
    pair, _ = run_setting("dp-ep", setup, workload, 2)
    assert lone.num_waves == 2 * 65536 // 16384  # 16,384 tokens per wave, one device's
    assert pair.input_tok_s > 1.8 * lone.input_tok_s  # two requests keep both devices busy


def test_budget_tokens_replace_the_fixed_budgets_and_dp_ep_counts_per_device():
    setup = SimSetup(MODELS["glm-5"], HARDWARE["B300"], 4)
    assert fixed_budget(get_system("static"), setup) == 8192
    assert fixed_budget(get_system("trtllm-pp"), setup) == 8192
    assert fixed_budget(get_system("dp-ep"), setup) == 16384 * 4
    big = SimSetup(MODELS["glm-5"], HARDWARE["B300"], 4, budget_tokens=131072)
    for name in BUDGETED:
        per = 4 if name == "dp-ep" else 1
        assert fixed_budget(get_system(name), big) == 131072 * per
    assert fixed_budget(get_system("wavepp"), big) is None  # the planner sizes its waves
    assert fixed_budget(get_system("sglang-pp"), big) == 16384  # SGLang's own chunking
    with pytest.raises(ValueError, match="budget_tokens"):
        SimSetup(MODELS["glm-5"], HARDWARE["B300"], 4, budget_tokens=-1)


@pytest.mark.parametrize("budget, waves_per_prompt", [(0, 16), (131072, 1)])
def test_static_with_a_prompt_sized_budget_runs_each_prompt_unchunked(budget, waves_per_prompt):
    setup = SimSetup(MODELS["glm-5"], HARDWARE["B300"], 4, budget_tokens=budget)
    workload = cold_prompts(setup, 4, 131072)
    result, _ = run_setting("static", setup, workload, 1)
    assert result.num_failed == 0
    assert result.num_waves == 4 * waves_per_prompt


def test_dp_ep_runs_where_its_weights_fit_and_says_where_they_do_not():
    fits = SimSetup(with_precision(MODELS["deepseek-v3"], weights="nvfp4"), HARDWARE["GB300"], 2)
    assert build_system("dp-ep", fits) is not None
    tight = SimSetup(with_precision(MODELS["deepseek-v3"], weights="nvfp4"), HARDWARE["GB200"], 2)
    with pytest.raises(ValueError, match="GB200 has 186 GB"):
        build_system("dp-ep", tight)


def test_simulate_takes_the_precisions_gb300_and_a_budget(tmp_path, capsys):
    from wavepp.cli import main

    out = tmp_path / "rows.json"
    argv = [
        "simulate",
        *("--model", "deepseek-v3", "--weights", "nvfp4", "--attention-dtype", "fp8"),
        *("--kv-dtype", "fp8", "--hardware", "GB300", "--pp", "2", "--policy", "dp-ep,tp-ep"),
        *("--workload", "cold", "--prompt-len", "2048", "--concurrency", "64"),
        *("--num-requests", "128", "--budget-tokens", "8192", "--json", str(out)),
    ]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    assert [r["policy"] for r in rows] == ["dp-ep", "tp-ep"]
    for r in rows:
        assert r["input_tok_s"] > 0 and r["ttft_p50_s"] > 0
        assert (r["weights"], r["attention_dtype"], r["kv_dtype"]) == ("nvfp4", "fp8", "fp8")
        assert r["hardware"] == "GB300"
    # DP attention exchanges less than TP attention at the same budget
    assert rows[0]["input_tok_s"] > rows[1]["input_tok_s"]


def test_the_paper_grids_run_the_papers_precisions_and_the_earlier_setups_keep_bf16():
    from wavepp.sim.studies.grid import kimi_k3_grid, paper_grid, precision_columns, with_overrides

    def columns(setting):
        return tuple(precision_columns(setting.setup()).values())

    assert {columns(s) for s in paper_grid()} == {("nvfp4", "fp8", "fp8")}
    assert {columns(s) for s in paper_grid("legacy")} == {("fp8", "bf16", "bf16")}
    assert {columns(s) for s in kimi_k3_grid()} == {("nvfp4", "fp8", "fp8")}
    assert {columns(s) for s in kimi_k3_grid("nvlink")} == {("nvfp4", "bf16", "bf16")}
    assert all("dp-ep" in s.policies and "tp-ep" in s.policies for s in kimi_k3_grid())
    bf16 = with_overrides(paper_grid(), attention_dtype="bf16", budget_tokens=4096)
    assert {columns(s) for s in bf16} == {("nvfp4", "bf16", "fp8")}
    assert {s.setup().budget_tokens for s in bf16} == {4096}


def test_the_busiest_expert_device_sets_the_experts_and_the_exchange():
    """An EP group waits for its busiest device: the routed experts and the exchange cost
    1 / balancedness of the mean's (SGLang's curve: 0.80 at 32 GPUs with EPLB, 0.55 without)."""
    m = MODELS["deepseek-v3"]
    even = [(0, 16384)] * 32
    perfect = _stage(m, "H100", 32, "dp", nodes=4).breakdown(even)
    for placement, expected in (("eplb", 0.80), ("default", 0.55)):
        assert balancedness(32, placement) == pytest.approx(expected)
        got = _stage(m, "H100", 32, "dp", 4, Execution(placement=placement)).breakdown(even)
        # (its GEMMs have more rows a expert too: their tiles fill a little better)
        assert got["moe_routed"] == pytest.approx(perfect["moe_routed"] / expected, rel=2e-3)
        assert got["collectives"] == pytest.approx(perfect["collectives"] / expected, rel=1e-9)
    # the curve falls with the group's size, and one device is balanced
    assert balancedness(1, "default") == 1.0
    assert balancedness(8, "eplb") > balancedness(16, "eplb") > balancedness(32, "eplb")
    assert balancedness(8, "default") > balancedness(32, "default") > balancedness(64, "default")


def test_two_batch_overlap_hides_the_exchange_behind_compute_on_fewer_sms():
    """tbo: the exchange runs beside compute, which keeps num_sms - COMM_SMS SMs for the whole
    layer; only an exchange longer than that compute shows."""
    m = MODELS["deepseek-v3"]
    even = [(0, 16384)] * 32
    serial = _stage(m, "H100", 32, "dp", nodes=4).breakdown(even)
    tbo = _stage(m, "H100", 32, "dp", 4, Execution(overlap="tbo", placement="perfect"))
    over = tbo.breakdown(even)
    compute = sum(v for k, v in serial.items() if k not in ("collectives", "dp_sync"))
    sms = HARDWARE["H100"].num_sms
    assert over["comm_sms"] == pytest.approx(compute * COMM_SMS / (sms - COMM_SMS), rel=1e-9)
    assert over["collectives"] == pytest.approx(
        max(0.0, serial["collectives"] - compute * sms / (sms - COMM_SMS)), rel=1e-9
    )
    assert sum(over.values()) < sum(serial.values())
