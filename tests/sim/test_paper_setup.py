"""The paper grid in the paper's setup (NVFP4, trtllm-pp as TensorRT-LLM 1.3.0rc26) and the
earlier one, both reachable."""

import pytest

from wavepp.sim.studies.grid import get_grid, paper_grid, run_grid, with_overrides


def test_the_paper_setup_is_the_default_and_the_earlier_one_stays_reachable():
    paper, legacy = paper_grid(), paper_grid("legacy")
    assert len(paper) == len(legacy) == 40
    assert {(s.weights, s.trtllm, s.max_wave_tokens) for s in paper} == {("nvfp4", "rc26", 16384)}
    assert {(s.weights, s.trtllm, s.max_wave_tokens) for s in legacy} == {("", "legacy", 0)}
    assert get_grid("paper", paper_setup="legacy") == legacy
    assert [s for s in get_grid("all") if s.grid == "paper"] == paper
    with pytest.raises(ValueError, match="unknown paper setup"):
        paper_grid("nvfp8")


def test_rows_name_the_weights_and_the_trtllm_mechanisms():
    small = [s for s in paper_grid() if s.workload.kind == "short_suffix"][:1]
    small = with_overrides(
        small, num_requests=8, concurrency=4, token_scale=64, policies=("wavepp", "trtllm-pp")
    )
    rows = run_grid(small)
    assert [(r["weights"], r["trtllm"]) for r in rows] == [("nvfp4", "rc26")] * 2
    assert all(r["num_failed"] == 0 for r in rows)


def test_the_attribution_steps_end_at_the_papers_trtllm():
    from wavepp.sim.loops.trtllm import TRTLLM_LEGACY, TRTLLM_RC26
    from wavepp.sim.studies.attribution import (
        STEPS,
        VARIANTS,
        attribution_markdown,
        attribution_rows,
    )

    assert STEPS[0][1:] == ("", TRTLLM_LEGACY) and STEPS[-1][1:] == ("nvfp4", TRTLLM_RC26)
    assert all(mech != TRTLLM_RC26 for _, _, mech in VARIANTS)
    rows = attribution_rows(("minimax-m2",), concurrency=8, num_requests=16)
    assert len(rows) == len(STEPS) + len(VARIANTS) and all(r["failed"] == 0 for r in rows)
    assert "| + (a) the budget charges" in attribution_markdown(rows)


def test_kimi_k3_is_a_hybrid_of_kimi_linears_pattern_at_2_8t():
    from wavepp.sim import HARDWARE, get_model

    m = get_model("kimi-k3")
    mla = [i + 1 for i in range(m.num_layers) if not m.is_linear(i)]
    assert mla == list(range(4, 61, 4)) + [61] and len(m.linear_layers) == 45
    assert m.num_params() == pytest.approx(2.80e12, rel=0.01)
    assert m.gemm_dtype == "nvfp4" and HARDWARE["GB300"].peak_flops("nvfp4") == 15e15


def test_the_kimi_k3_grid_runs_the_hybrid_with_real_snapshots():
    from wavepp.sim.studies.grid import kimi_k3_grid

    grid = kimi_k3_grid()
    assert len(grid) == 36 and {s.model for s in grid} == {"kimi-k3"}
    assert all(s.hardware == "GB300" and s.snapshot_interval_blocks == 4 for s in grid)
    small = with_overrides(
        [s for s in grid if s.workload.kind == "reuse"][:1],
        num_requests=8,
        concurrency=4,
        policies=("wavepp", "tp-ep"),
    )
    rows = run_grid(small)
    assert all(r["num_failed"] == 0 and r["hit_rate"] > 0 for r in rows)


def test_the_ablation_settings_are_the_papers_three_on_both_kimi_shapes():
    from wavepp.sim.studies.attribution import PAPER_ABLATION, ablation_settings

    settings = ablation_settings()
    assert {(s.model, s.workload.label, s.concurrency) for s in settings} == {
        (m, w, c) for m in ("kimi-k2", "kimi-k3") for (w, c) in PAPER_ABLATION
    }
    assert all(s.hardware == "B300" and s.pp == 8 for s in settings)
