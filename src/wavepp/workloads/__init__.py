"""Seeded, reproducible prompt workloads shared by the benchmark and the simulator."""

from wavepp.workloads.registry import WORKLOADS, WorkloadSpec, make_workload
from wavepp.workloads.synthetic import cold, gsp, mixed, reuse, short_suffix
from wavepp.workloads.trace import trace
from wavepp.workloads.workload import Workload, ideal_hit_rate, reusable_tokens

__all__ = ["WORKLOADS", "WorkloadSpec", "make_workload", "cold", "gsp", "mixed", "reuse",
           "short_suffix", "trace", "Workload", "ideal_hit_rate", "reusable_tokens"]
