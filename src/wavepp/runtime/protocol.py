"""Runtime-level messages around the sched messages: setup, control, headers, results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from wavepp.cache import BlockChanges, CapacityView
from wavepp.kv_transfer.export import ExportOutcome
from wavepp.runtime.config import RuntimeConfig
from wavepp.sched import TokenResult, Wave
from wavepp.sched.stage_server import StageCounters


class EngineError(RuntimeError):
    """The pipeline cannot go on (a stage died, failed to load, or rejected the leader's plan),
    or the engine was shut down."""


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
class ExportReport:
    """What a stage's KV writer did with its parts, on its way to rank 0: down the pipeline on
    the headers plane (each stage's LOOP passes it on, in order with its waves), then from the
    last stage on the results plane. Rank 0 holds a request's answer until every stage's part
    of it is reported."""

    outcomes: tuple[ExportOutcome, ...]


@dataclass(frozen=True)
class Setup:
    config: RuntimeConfig


@dataclass(frozen=True)
class StageReady:
    stage_id: int
    num_blocks: int
    kernels: str = ""  # the kernel paths the stage chose at start-up (StageRuntime.kernels)


@dataclass(frozen=True)
class LoadFailed:
    """A stage could not build itself (checkpoint, memory, configuration); it exits next."""

    stage_id: int
    reason: str


@dataclass(frozen=True)
class Reset:
    """Empty the stage cache, switch policy and, for a hybrid model, the snapshot grid (None:
    keep it). Sent only while the pipeline is idle, to every stage with the same values."""

    policy: str
    snapshot_interval_blocks: int | None = None


@dataclass(frozen=True)
class CheckIntegrity:
    """Ask for the stage cache's integrity and capacity (pipeline idle)."""


@dataclass(frozen=True)
class ResetDone:
    stage_id: int


class IntegrityReport(NamedTuple):
    """A stage's answer to CheckIntegrity: its pool passed check_integrity(); what it holds."""

    capacity: CapacityView
    num_live_requests: int


@dataclass(frozen=True)
class ControlReply:
    """The reply to a control message (Reset, CheckIntegrity, runtime.profile.ProfileWaves)."""

    stage_id: int
    detail: object  # ResetDone | IntegrityReport | runtime.profile.ProfileTimes


# What LOOP takes from its inbox, in order
@dataclass(frozen=True)
class RoundWork:
    """A rounds-plane message LOOP answers between waves (inline admission)."""

    msg: object


@dataclass(frozen=True)
class WaveWork:
    header: WaveHeader
    hidden: object  # torch.Tensor [num_tokens, hidden_size], or None for an empty wave


@dataclass(frozen=True)
class CacheQuery:
    """A question from outside the round protocol (a router's, runtime/cache_queries.py): how
    much of each prompt this stage holds, as a probe would answer it, with nothing remembered.
    Rank 0 -> stage s on the queries plane."""

    query_id: int
    items: tuple  # ProbeItem: (id, block hashes, tokens)


@dataclass(frozen=True)
class CacheAnswer:
    """A stage's answer to a CacheQuery (stage s -> rank 0 on the answers plane): one Hint per
    item, and its blocks by state now; with KV cache events, what its pool did to its computed
    blocks since the last query (its BlockLog drained)."""

    query_id: int
    stage_id: int
    hints: tuple
    capacity: CapacityView
    counters: StageCounters = StageCounters()  # StageServer.counters()
    block_changes: BlockChanges = BlockChanges()
