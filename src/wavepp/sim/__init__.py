"""Discrete-event simulation of the pipeline, driving the real sched and cache code, with cost
models of real hardware and model shapes (and of this machine, fitted from measurements)."""

from wavepp.sim.core.events import EventLoop
from wavepp.sim.core.pipeline import PipelineSim, SimCosts, StageStats
from wavepp.sim.cost.hardware import HARDWARE, HardwareSpec, get_hardware
from wavepp.sim.cost.model_catalog import MODELS, get_model
from wavepp.sim.cost.model_shapes import ModelShape
from wavepp.sim.cost.precision import WEIGHT_FORMATS, with_weights
from wavepp.sim.cost.stage_cost import ExecOverheads, StageCostModel, sparse_pairs, transfer_seconds
from wavepp.sim.cost.stages import MemoryBudget, partition_layers, stage_kv_tokens, stage_models
from wavepp.sim.harness import SimReport, build_sim, run_closed_loop
from wavepp.sim.loops.loop_costs import LoopCosts
from wavepp.sim.loops.loop_sim import LoopSim
from wavepp.sim.loops.sglang import (
    SGLANG_LEGACY,
    SGLANG_PRESETS,
    SGLANG_V0518,
    SglangMechanisms,
    get_sglang,
)
from wavepp.sim.loops.trtllm import (
    TRTLLM_LEGACY,
    TRTLLM_PRESETS,
    TRTLLM_RC26,
    TrtllmMechanisms,
    get_trtllm,
)
from wavepp.sim.loops.vllm_pp import VLLM_LEGACY, VLLM_PRESETS, VLLM_V0280, VllmMechanisms, get_vllm
from wavepp.sim.studies.calibrate import (
    CPU_ADMISSION,
    CpuHardware,
    StageSample,
    fit_stage_costs,
    loop_costs_from_rounds,
)
from wavepp.sim.studies.grid import (
    GRIDS,
    GridSetting,
    WorkloadShape,
    get_grid,
    kimi_grid,
    paper_grid,
    run_grid,
)
from wavepp.sim.studies.output import (
    chrome_trace,
    grid_summary,
    print_table,
    write_json,
    write_plot,
    write_trace,
)
from wavepp.sim.studies.scenario import (
    build_system,
    fit_prior,
    run_setting,
    scaled_costs,
)
from wavepp.sim.studies.sim_setup import AdmissionCosts, SimResult, SimSetup
from wavepp.sim.studies.systems import SYSTEMS, SystemSpec, get_system

__all__ = [
    "CPU_ADMISSION",
    "CpuHardware",
    "StageSample",
    "fit_stage_costs",
    "loop_costs_from_rounds",
    "ExecOverheads",
    "StageCostModel",
    "sparse_pairs",
    "transfer_seconds",
    "EventLoop",
    "GRIDS",
    "GridSetting",
    "WorkloadShape",
    "get_grid",
    "kimi_grid",
    "paper_grid",
    "run_grid",
    "HARDWARE",
    "HardwareSpec",
    "get_hardware",
    "SimReport",
    "build_sim",
    "run_closed_loop",
    "LoopCosts",
    "LoopSim",
    "MODELS",
    "ModelShape",
    "get_model",
    "chrome_trace",
    "grid_summary",
    "print_table",
    "write_json",
    "write_plot",
    "write_trace",
    "PipelineSim",
    "SimCosts",
    "StageStats",
    "AdmissionCosts",
    "SimResult",
    "SimSetup",
    "build_system",
    "fit_prior",
    "run_setting",
    "scaled_costs",
    "MemoryBudget",
    "partition_layers",
    "stage_kv_tokens",
    "stage_models",
    "SYSTEMS",
    "SystemSpec",
    "get_system",
    "WEIGHT_FORMATS",
    "with_weights",
    "TRTLLM_LEGACY",
    "TRTLLM_PRESETS",
    "TRTLLM_RC26",
    "TrtllmMechanisms",
    "get_trtllm",
    "SGLANG_LEGACY",
    "SGLANG_PRESETS",
    "SGLANG_V0518",
    "SglangMechanisms",
    "get_sglang",
    "VLLM_LEGACY",
    "VLLM_PRESETS",
    "VLLM_V0280",
    "VllmMechanisms",
    "get_vllm",
]
