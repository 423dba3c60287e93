"""Fitting a CPU "hardware" from stage samples; the paper grids; `wavepp simulate` outputs."""

import argparse
import json

import pytest

from wavepp.cli import simulate as cli_simulate
from wavepp.sched import CostCoefficients, CostModel
from wavepp.sim import (
    CpuHardware,
    StageSample,
    fit_stage_costs,
    grid_summary,
    kimi_grid,
    paper_grid,
    run_grid,
)
from wavepp.sim.studies.grid import with_overrides
from wavepp.sim.studies.output import rank_of

TRUE = (
    CostCoefficients(c_wave=2e-3, c0=3e-4, g=2e-7, b=4e-4, a=2e-9),
    CostCoefficients(c_wave=1e-3, c0=1e-4, g=1e-7, b=6e-4, a=1e-9),
)


def samples():
    out = []
    for stage, coef in enumerate(TRUE):
        model = CostModel(coef)
        for L in (0, 256, 1024, 4096):
            for x in (16, 64, 256, 512):
                for n in (1, 3):
                    chunks = ((L, x),) * n
                    out.append(StageSample(stage, chunks, model.wave_time(chunks)))
    return out


def test_fit_recovers_each_stages_coefficients():
    fitted = fit_stage_costs(samples())
    for got, want in zip(fitted, TRUE):
        for name in ("c_wave", "c0", "g", "b", "a"):
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=0.02), name
    with pytest.raises(ValueError, match="no samples for stage"):
        fit_stage_costs(samples()[:5], num_stages=2)


def test_fitted_cpu_pipeline_predicts_the_flow_shop_time():
    cpu = CpuHardware.fit(samples(), transfer_latency_s=1e-4)
    costs = cpu.sim_costs()
    chunks = [(128, 256)]
    assert costs.wave_seconds(1, chunks) == pytest.approx(
        CostModel(TRUE[1]).wave_time(chunks), rel=0.02
    )
    sim = cpu.build("wavepp", stage_num_blocks=256, check_integrity=True)
    from wavepp.sim import run_closed_loop

    rep = run_closed_loop(sim, [[5] * 200, [6] * 300], 2)
    assert rep.num_failed == 0 and rep.input_tok_s > 0
    with pytest.raises(ValueError, match="tp-ep"):
        cpu.build("tp-ep")


PP_POLICIES = ("wavepp", "wavepp-mpu", "lockstep", "static", "sglang-pp", "vllm-pp")
PAPER_POLICIES = ("wavepp", "wavepp-mpu", "lockstep", "static", "trtllm-pp", "sglang-pp", "vllm-pp")


def test_paper_grid_is_forty_settings_of_every_pp_policy():
    grid = paper_grid()
    assert len(grid) == 40
    assert {s.model for s in grid} == {"glm-5", "minimax-m2"}
    assert {s.concurrency for s in grid} == {8, 16, 32, 64, 128}
    assert {s.workload.kind for s in grid} == {"cold", "mixed", "reuse", "short_suffix"}
    assert all(s.pp == 4 and s.hardware == "B300" and s.policies == PAPER_POLICIES for s in grid)
    short = [s for s in grid if s.workload.kind == "short_suffix"][0].workload
    assert short.suffix_len == 4096 and short.prefix_len > 4 * short.suffix_len


def test_kimi_grid_covers_long_prompts_and_every_policy():
    grid = kimi_grid()
    assert len(grid) >= 28
    assert {s.workload.prompt_len for s in grid} == {65536, 131072, 262144}
    assert {s.concurrency for s in grid} == {1, 2, 4, 8, 16, 32}
    assert grid[0].policies == PP_POLICIES + ("tp-ep",)


def test_run_grid_rows_carry_the_required_fields():
    small = with_overrides(
        paper_grid()[:1],
        num_requests=8,
        concurrency=4,
        token_scale=64,
        policies=("wavepp", "lockstep"),
    )
    rows = run_grid(small)
    assert [r["policy"] for r in rows] == ["wavepp", "lockstep"]
    for r in rows:
        for key in (
            "grid",
            "model",
            "hardware",
            "pp",
            "workload",
            "concurrency",
            "policy",
            "input_tok_s",
        ):
            assert key in r
        assert r["num_failed"] == 0 and r["input_tok_s"] > 0


def test_grid_summary_counts_wins_and_names_the_losers():
    rows = [
        {
            "grid": "g",
            "model": "m",
            "workload": "short_suffix-1k",
            "concurrency": c,
            "policy": p,
            "input_tok_s": v,
        }
        for c, p, v in [
            (8, "wavepp", 2.0),
            (8, "lockstep", 1.0),
            (8, "tp-ep", 3.0),
            (128, "wavepp", 4.0),
            (128, "lockstep", 1.0),
            (128, "tp-ep", 1.0),
        ]
    ]
    text = "\n".join(grid_summary(rows))
    assert "wavepp >= lockstep in 2 of 2" in text
    assert "c=128: wavepp/lockstep = 4.00x" in text
    assert "wavepp highest of all policies in 1 of 2" in text and "tp-ep 1.500x of wavepp" in text
    assert "(ties within 2%) in 1 of 2" in text


def test_the_paper_table_sets_ours_beside_the_papers_figures():
    from wavepp.sim.studies.output import paper_comparison

    settings = {
        ("paper", "glm-5", "short_suffix-28k+4k", 128): {"wavepp": 606.5e3, "trtllm-pp": 208e3},
        ("paper", "glm-5", "short_suffix-28k+4k", 64): {"wavepp": 1.0, "trtllm-pp": 1.0},
        ("paper", "glm-5", "reuse-8k", 128): {"wavepp": 1.0, "trtllm-pp": 1.0},
    }
    (line,) = paper_comparison(settings)
    assert "wavepp 606K (paper 1,213K, 0.50x of it)" in line
    assert "trtllm-pp 208K (paper 416K, 0.50x)" in line
    assert "wavepp/trtllm-pp 2.92x (paper 2.92x)" in line
    rows = [
        {
            "grid": "paper",
            "model": "glm-5",
            "workload": "short_suffix-28k+4k",
            "concurrency": 128,
            "policy": p,
            "input_tok_s": v,
        }
        for p, v in (("wavepp", 606.5e3), ("trtllm-pp", 208e3))
    ]
    assert "[paper] wavepp >= trtllm-pp in 1 of 1 settings (1 within 2%)" in grid_summary(rows)


def test_rank_counts_only_policies_more_than_two_percent_faster():
    values = {"wavepp": 100.0, "static": 101.9, "vllm-pp": 103.0, "lockstep": 50.0}
    assert rank_of("wavepp", values) == 2  # static ties; vllm-pp is 3% faster
    assert rank_of("vllm-pp", values) == 1 and rank_of("lockstep", values) == 4


def test_grid_takes_policy(capsys, monkeypatch):
    """--grid with --policy runs the grid's settings under the given policies only."""
    import wavepp.sim.studies.grid as grid_mod

    seen = []

    def fake_run_grid(settings, jobs=1):
        seen.extend(settings)
        return []

    monkeypatch.setattr(grid_mod, "run_grid", fake_run_grid)
    assert run_cli("--grid", "kimi", "--policy", "wavepp,static") == 0
    assert len(seen) == 36 and all(s.policies == ("wavepp", "static") for s in seen)
    seen.clear()
    assert run_cli("--grid", "paper") == 0
    assert len(seen) == 40 and all(s.policies == PAPER_POLICIES for s in seen)
    assert {s.token_scale for s in seen} == {16}  # the grid's own scale
    seen.clear()
    assert run_cli("--grid", "kimi") == 0
    assert {s.token_scale for s in seen} == {256}
    seen.clear()
    assert run_cli("--grid", "kimi", "--token-scale", "16") == 0  # the same grid, finer
    assert len(seen) == 36 and {s.token_scale for s in seen} == {16}
    with pytest.raises(ValueError, match="--token-scale must be positive"):
        run_cli("--grid", "kimi", "--token-scale", "0")


def run_cli(*argv):
    parser = argparse.ArgumentParser(prog="wavepp")
    cli_simulate.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", *argv])
    return args.func(args)


def test_simulate_writes_json_plot_and_trace(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert (
        run_cli(
            "--model",
            "minimax-m2",
            "--pp",
            "2",
            "--workload",
            "short-suffix,cold",
            "--policy",
            "wavepp,vllm-pp",
            "--concurrency",
            "4",
            "--num-requests",
            "8",
            "--prefix-len",
            "2048",
            "--suffix-len",
            "512",
            "--prompt-len",
            "2048",
            "--token-scale",
            "64",
            "--block-size",
            "8",
            "--check-integrity",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "p.png"),
            "--trace",
            str(tmp_path / "t.json"),
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [(r["workload"], r["policy"]) for r in rows] == [
        ("short_suffix", "wavepp"),
        ("short_suffix", "vllm-pp"),
        ("cold", "wavepp"),
        ("cold", "vllm-pp"),
    ]
    assert all(r["pp"] == 2 and r["num_failed"] == 0 for r in rows)
    assert (tmp_path / "p.png").stat().st_size > 1000
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert sum(e["name"] == "process_name" for e in events) == 4
    assert sum(e["ph"] == "X" and e["name"].startswith("wave") for e in events) > 0
    assert "wavepp simulate" in capsys.readouterr().out


def test_simulate_rejects_unknown_policy_and_trace_with_grid():
    with pytest.raises(ValueError, match="unknown policy"):
        run_cli("--policy", "nope")
    with pytest.raises(ValueError, match="--trace"):
        run_cli("--grid", "paper", "--trace", "x.json")


def test_markdown_tables_bold_the_best_and_rank_wavepp():
    from wavepp.sim.studies.output import markdown_tables

    rows = [
        {
            "grid": "g",
            "model": "m",
            "hardware": "B300",
            "pp": 4,
            "workload": "cold-8k",
            "concurrency": 8,
            "policy": p,
            "input_tok_s": v,
        }
        for p, v in [("wavepp", 99e3), ("static", 100e3), ("lockstep", 50e3)]
    ]
    text = markdown_tables(rows)
    assert "| workload | c | wavepp | static | lockstep | wavepp rank |" in text
    assert "| cold-8k | 8 | 99.0k | **100k** | 50.0k | 1 |" in text
