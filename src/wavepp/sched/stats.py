"""Per-stage time accounting and quantiles, shared by the runtime, the simulator and the bench."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass
class StageStats:
    busy_s: float = 0.0  # computing waves
    round_s: float = 0.0  # answering rounds on LOOP (inline admission)
    idle_input_s: float = 0.0  # LOOP idle, nothing to run
    idle_admission_s: float = 0.0  # idle or blocked while the pipeline waits for admission
    num_waves: int = 0


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, linearly interpolated between the nearest ranks."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])
