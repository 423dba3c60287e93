"""benchmarks/gpu_check.sh on the CPU: every step but the device (DEVICE=cpu, tiny shapes),
its outputs there and parsed. The script's defaults (real shapes, CUDA) run on a GPU only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from wavepp.random_checkpoint import make_model

ROOT = Path(__file__).resolve().parents[2]


def run_script(tmp_path, timeout_s: float, **env: str) -> subprocess.CompletedProcess:
    """benchmarks/gpu_check.sh with DEVICE=cpu, its outputs under tmp_path/out and its models
    under tmp_path/models, where the moe checkpoint is made first (the script keeps a checkpoint
    it finds; the llama one it makes itself); `env`: more of its knobs."""
    make_model(tmp_path / "models" / "moe", arch="deepseek_v3", num_layers=2, seed=1)
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")],
        env={
            **os.environ,
            "OUT": str(tmp_path / "out"),
            "DEVICE": "cpu",
            "PYTHON": sys.executable,
            "MODELS_DIR": str(tmp_path / "models"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_gpu_check_runs_every_step_and_writes_its_outputs(tmp_path):
    out, models = tmp_path / "out", tmp_path / "models"
    done = run_script(
        tmp_path,
        240,
        PPS="2",  # PP = 1 is the same command with --pp 1 (tests/bench/test_bench_cli.py)
        DTYPE="float32",
        # every test there skips without CUDA: the step itself is checked
        TESTS="tests/gpu/test_cuda_families.py",
        LLAMA_ARGS="--arch llama --layers 2 --set head_dim=32",
        BENCH_ARGS="--workload cold --concurrency 1 --num-requests 2 --policy wavepp "
        "--repeat 1 --prompt-len 16 --layer-split even",
        ROOFLINE_ARGS="--pp 2 --stage 0 --waves 2x8@16,1x8@0 --runs 1 --matmul-size 64",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"] == "cpu"
    assert [s["step"] for s in summary["steps"]] == [
        "env",
        "tests",
        "model-llama",
        "model-moe",
        "bench-llama-pp2",
        "bench-moe-pp2",
        "roofline-llama",
        "roofline-moe",
    ]
    assert all(s["exit"] == 0 for s in summary["steps"]), summary
    assert "torch" in (out / "env.txt").read_text()
    assert 'skipped="' in (out / "tests.xml").read_text()  # pytest's report, every test skipped
    assert json.loads((models / "llama" / "config.json").read_text())["head_dim"] == 32
    assert "exists: kept" in (out / "model-moe.log").read_text()
    for model in ("llama", "moe"):
        bench = json.loads((out / f"bench-{model}-pp2.json").read_text())
        (row,) = bench["rows"]
        assert (row["pp"], row["policy"], row["num_failed"]) == (2, "wavepp", 0)
        assert row["input_tok_s"] > 0
        roofline = json.loads((out / f"roofline-{model}.json").read_text())
        assert roofline["device_type"] == "cpu" and roofline["roofline_tflops"] > 0
        assert [w["wave"] for w in roofline["waves"]] == ["2x8@16", "1x8@0"]
        assert all(w["ms"] > 0 and 0 < w["roofline_share"] for w in roofline["waves"])


def test_a_failed_step_fails_the_script_after_the_others_ran(tmp_path):
    """A checkpoint that cannot be made (an unknown --set field): the summary names the
    step, the next step still ran, and the script exits 1."""
    out = tmp_path / "out"
    done = run_script(
        tmp_path, 120, STEPS="models", LLAMA_ARGS="--arch llama --layers 2 --set no_such_field=1"
    )
    assert done.returncode == 1 and "failed: model-llama" in done.stderr
    steps = {s["step"]: s["exit"] for s in json.loads((out / "summary.json").read_text())["steps"]}
    assert steps["model-llama"] != 0 and steps["model-moe"] == 0
    assert "no_such_field" in (out / "model-llama.log").read_text()
