"""Runtime-level messages around the sched messages: setup, control, headers, results."""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.runtime.config import RuntimeConfig
from wavepp.sched import TokenResult, Wave


@dataclass(frozen=True)
class StageTiming:
    """What a stage did for one wave: idle before it, computing it, serving rounds on LOOP.
    start_unix_s: wall-clock start of the compute (comparable across local processes)."""
    stage_id: int
    wait_s: float
    compute_s: float
    round_s: float
    start_unix_s: float = 0.0


@dataclass(frozen=True)
class WaveHeader:
    wave: Wave
    timings: tuple[StageTiming, ...]


@dataclass(frozen=True)
class ResultMsg:
    wave_id: int
    tokens: tuple[TokenResult, ...]
    timings: tuple[StageTiming, ...]


@dataclass(frozen=True)
class Setup:
    config: RuntimeConfig


@dataclass(frozen=True)
class StageReady:
    stage_id: int
    num_blocks: int


@dataclass(frozen=True)
class Reset:
    """Empty the stage cache and switch policy (sent only while the pipeline is idle)."""
    policy: str


@dataclass(frozen=True)
class CheckIntegrity:
    """Ask for the stage cache's integrity and capacity (pipeline idle)."""


@dataclass(frozen=True)
class Ack:
    stage_id: int
    detail: object = None
