"""Discrete-event simulation of the pipeline, driving the real sched and cache code."""

from wavepp.sim.events import EventLoop
from wavepp.sim.harness import SimReport, build_sim, run_closed_loop
from wavepp.sim.pipeline import PipelineSim, SimCosts, StageStats

__all__ = ["EventLoop", "SimReport", "build_sim", "run_closed_loop", "PipelineSim", "SimCosts",
           "StageStats"]
