"""benchmarks/public_figures.py as a test: published GPU prefill throughputs against the cost
model, each within the stated tolerance or a documented miss (the model over-predicts)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.sim.test_dp_layout import cold_prompts
from wavepp.sim import HARDWARE, MODELS
from wavepp.sim.cost.precision import with_precision
from wavepp.sim.studies.scenario import SimSetup, run_setting

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "public_figures.py"
_SPEC = importlib.util.spec_from_file_location("public_figures", _PATH)
public_figures = importlib.util.module_from_spec(_SPEC)
sys.modules["public_figures"] = public_figures  # dataclasses look their module up there
_SPEC.loader.exec_module(public_figures)

ROWS = public_figures.rows()


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_each_figure_is_within_tolerance_or_a_documented_over_prediction(row):
    assert row["within"] == (abs(row["ratio"] - 1) <= public_figures.TOLERANCE)
    if row["within"]:
        assert not row["miss"]
    else:
        # the miss says why; the model over-predicts these by under 2x (a change that closes
        # the gap or widens it past 2x shows here, and the table and docs must follow)
        assert row["miss"]
        assert 1 + public_figures.TOLERANCE < row["ratio"] <= 2.0


def test_misses_are_listed_first_and_the_h100_rows_are_the_blogs():
    within = [r["within"] for r in ROWS]
    assert within == sorted(within)  # every miss before every pass
    h100 = [r for r in ROWS if "H100 EP32" in r["name"]]
    assert sorted(r["published"] for r in h100) == [50302, 54543, 57674]
    assert all(r["unit"] == "tok/s per node" for r in h100)


def test_the_simulator_agrees_with_the_cost_model_on_the_h100_setup():
    """`wavepp simulate --policy dp-ep` on the H100 row's setup: the closed loop's throughput
    is the cost model's forward throughput, less the pipeline's fill and drain."""
    fig = next(f for f in public_figures.FIGURES if f.hardware == "H100")
    setup = SimSetup(
        with_precision(MODELS["deepseek-v3"], **fig.precision),
        HARDWARE["H100"],
        fig.devices,
        gpus_per_node=fig.devices // fig.nodes,
        budget_tokens=fig.tokens_per_device,
    )
    workload = cold_prompts(setup, 1024, fig.prompt_len)
    result, _ = run_setting("dp-ep", setup, workload, 256)
    per_gpu = result.input_tok_s / fig.devices
    assert per_gpu == pytest.approx(public_figures.predict(fig), rel=0.05)
    assert per_gpu < public_figures.predict(fig)


@pytest.mark.parametrize(
    "hardware, dtype, tflops",
    [
        ("GB200", "bf16", 1683),
        ("GB200", "fp8", 2532),
        ("GB300", "bf16", 2061),
        ("GB300", "fp8", 3393),
    ],
)
def test_attention_runs_at_the_cudnn_measurement_it_cites(hardware, dtype, tflops):
    """NVIDIA/cudnn-frontend's DeepSeek-V3 MLA prefill shape (128 heads, d_qk 192, d_v 128,
    2 x 16,384 causal tokens), cuDNN 9.27: the model's attention time gives back its TFLOPS."""
    from wavepp.sim import ExecOverheads, StageCostModel

    m = with_precision(MODELS["deepseek-v3"], attention=dtype)
    none = ExecOverheads(wave_s=0.0, chunk_s=0.0, small_kernels=False)
    stage = StageCostModel(m, HARDWARE[hardware], 5, 6, overheads=none)
    n = 16384
    seconds = stage.breakdown([(0, n), (0, n)])["attention"]
    flops = 2 * (n * (n + 1) / 2) * 2 * 128 * (192 + 128)
    assert flops / seconds / 1e12 == pytest.approx(tflops, rel=0.02)
