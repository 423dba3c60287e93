"""Seeded, reproducible prompt workloads shared by the benchmark and the simulator."""

from wavepp.workloads.registry import (
    WORKLOAD_NAMES,
    WORKLOADS,
    WorkloadOptions,
    WorkloadSpec,
    make_workload,
    workload_from_options,
)
from wavepp.workloads.synthetic import cold, gsp, mixed, reuse, short_suffix
from wavepp.workloads.trace import trace
from wavepp.workloads.workload import Workload, ideal_hit_rate, reusable_tokens

__all__ = [
    "WORKLOAD_NAMES",
    "WORKLOADS",
    "WorkloadOptions",
    "WorkloadSpec",
    "make_workload",
    "workload_from_options",
    "cold",
    "gsp",
    "mixed",
    "reuse",
    "short_suffix",
    "trace",
    "Workload",
    "ideal_hit_rate",
    "reusable_tokens",
]
