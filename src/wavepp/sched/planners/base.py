"""What every wave planner shares: its config, the work on its way (`Admitting`), the
`Planner` interface, and the chunk arithmetic.

Every planner packs first-come-first-served over the plannable requests (admitted, tokens left,
dependencies dispatched), at most one chunk per request per wave. Chunk ends after the reused
prefix are aligned to the block size, except a request's final chunk:

    [0, start)  reused or already dispatched | [start, end) this chunk | [end, num_tokens) later
                                               end % block_size == 0 or end == num_tokens

Hybrid models: every planner's wave then goes through `align_chunk_ends` (snapshot_align.py),
which moves chunk ends onto nearby snapshot boundaries (PlannerConfig.snapshot_align_frac).

The modules of this package import this one and nothing of each other, except the registry
(__init__.py), which imports them all; this one imports only snapshot_align.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from wavepp.sched.messages import Chunk
from wavepp.sched.planners.snapshot_align import align_chunk_ends
from wavepp.sched.request import Request


@dataclass(frozen=True)
class PlannerConfig:
    block_size: int = 16
    num_stages: int = 2
    # M: the largest wave (mpu, balanced). On the 2-core CPU runtime, waves past ~512 tokens
    # bought no efficiency and cost pipeline fill and drain (measured with `wavepp bench`).
    max_wave_tokens: int = 512
    min_wave_tokens: int = 64  # b_min: the smallest (mpu, balanced)
    static_wave_tokens: int = 512  # the static planner's budget
    max_chunks_per_wave: int = 256
    # the most tokens one request gets in a wave under a fixed budget (pack_tokens); 0: the
    # whole budget. Data-parallel attention (the simulator's dp-ep) runs each chunk on one
    # device, so a request gets at most one device's budget
    max_chunk_tokens: int = 0
    # the mpu planner's M and b_min; None: max_wave_tokens and min_wave_tokens. The paper runs
    # microbatch 16,384 and b_min 8,192 (MPU_PAPER_TOKENS); scaled to this CPU's 512-token
    # waves that is 512 and 256
    mpu_microbatch_tokens: int | None = None
    mpu_min_tokens: int | None = None
    # balanced: fill waves to M tokens after the longest prefix (True; GPU deployments, M from
    # the profiling pass) or keep predicted wave times equal under the fixed-cost cap (False)
    fill_waves: bool = False
    # balanced: with the pipeline full, hold back waves under this fraction of a fair share
    hold_frac: float = 0.5
    # balanced, filling waves: waves grow to 2M once this many waves of 2M per stage wait (and
    # no longer than the longest wave so far, `BalancedPlanner.plan`); 0: never. Chosen on the
    # simulator's grids (settings where wavepp is best, paper of 40 / kimi of 18 at c >= 8):
    # 0: 36/11, 2: 40/18, 3: 40/18, 4: 40/18, 5: 39/18, 6: 39/17, 8: 38/16
    deep_queue_waves: int = 4
    # hybrid models (snapshot_align.py): a chunk end moves onto a snapshot boundary (a
    # multiple of snapshot_interval_blocks blocks, or the request's last reusable boundary) at
    # most this fraction of the chunk away: down, or up where the wave's budget has room.
    # 1/8 keeps every wave within 1/8 of its planned tokens; 0: never move. The interval is the
    # stages' snapshot grid; 0 (models without linear-attention layers): no alignment
    snapshot_interval_blocks: int = 0
    snapshot_align_frac: float = 0.125

    def __post_init__(self) -> None:
        for name in (
            "block_size",
            "num_stages",
            "max_wave_tokens",
            "min_wave_tokens",
            "static_wave_tokens",
            "max_chunks_per_wave",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"PlannerConfig.{name} must be positive, got {getattr(self, name)}"
                )
        if self.min_wave_tokens > self.max_wave_tokens:
            raise ValueError(
                f"PlannerConfig.min_wave_tokens={self.min_wave_tokens} exceeds "
                f"max_wave_tokens={self.max_wave_tokens}"
            )
        if self.max_chunk_tokens < 0:
            raise ValueError(
                f"PlannerConfig.max_chunk_tokens must be >= 0, got {self.max_chunk_tokens}"
            )
        if self.deep_queue_waves < 0:
            raise ValueError(
                f"PlannerConfig.deep_queue_waves must be >= 0, got {self.deep_queue_waves}"
            )
        if self.snapshot_interval_blocks < 0:
            raise ValueError(
                f"PlannerConfig.snapshot_interval_blocks must be >= 0, got {self.snapshot_interval_blocks}"
            )
        if not 0 <= self.snapshot_align_frac < 1:
            raise ValueError(
                f"PlannerConfig.snapshot_align_frac must be in [0, 1), got {self.snapshot_align_frac}"
            )
        if not 0 <= self.hold_frac < 1:
            raise ValueError(f"PlannerConfig.hold_frac must be in [0, 1), got {self.hold_frac}")
        for name in ("mpu_microbatch_tokens", "mpu_min_tokens"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(
                    f"PlannerConfig.{name} must be positive, got {getattr(self, name)}"
                )
        if self.mpu_budgets[1] > self.mpu_budgets[0]:
            raise ValueError(
                f"PlannerConfig: the mpu b_min {self.mpu_budgets[1]} exceeds its "
                f"microbatch {self.mpu_budgets[0]}"
            )

    @property
    def mpu_budgets(self) -> tuple[int, int]:
        """(M, b_min) of the mpu planner."""
        return (
            self.mpu_microbatch_tokens or self.max_wave_tokens,
            self.mpu_min_tokens or self.min_wave_tokens,
        )


@dataclass(frozen=True)
class Admitting:
    """Work on its way to the planner: the requests in the admission round now running, then
    those waiting for one, as (cached, new) tokens each (cached is 0 until a round agrees the
    prefix: an upper bound on the work)."""

    items: Sequence[tuple[int, int]] = ()
    in_round: int = 0  # the first `in_round` items are in the running round
    round_left_s: float = math.inf  # predicted seconds until that round ends

    def __post_init__(self) -> None:
        if not 0 <= self.in_round <= len(self.items):
            raise ValueError(f"Admitting.in_round={self.in_round} outside 0..{len(self.items)}")
        if self.round_left_s < 0:
            raise ValueError(f"Admitting.round_left_s must be >= 0, got {self.round_left_s}")

    @property
    def round_items(self) -> Sequence[tuple[int, int]]:
        return self.items[: self.in_round]


NOTHING_ADMITTING = Admitting()


# The paper's MPU settings: microbatch M = 16,384 tokens, b_min = 8,192.
MPU_PAPER_TOKENS = (16384, 8192)


class Planner(Protocol):
    """Sizes the next wave. `plan` and `observe` never change a request (the leader advances
    requests as it dispatches waves and as they come back); a planner may keep state of its own,
    and this is all of it:

        static, dynamic  none (dynamic's cost model is fitted once, at warm-up, and kept)
        mpu              the budget in force and its hysteresis streaks: every `plan` call may
                         move them (`decide`), so two calls on the same requests can differ
        balanced         the waves it planned that have not all come back (every `plan` that
                         returns chunks records its wave; a wave is forgotten once its requests'
                         computed tokens pass its chunk ends, or they finish), the longest wave
                         predicted since the pipeline last drained (reset by `plan` when nothing
                         is in flight), and its cost model (refitted by `observe`); reading
                         `num_in_flight` or `in_flight_work()` forgets the waves that came back

    The leader calls `plan` only when its ring has room for a wave, and sends whatever `plan`
    returns (the balanced planner counts it in flight from that call on)."""

    name: str

    def plan(
        self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING
    ) -> list[Chunk]:
        """Chunks of the next wave from `requests` (plannable, FCFS order); [] sends nothing.

        `admitting`: the requests in or waiting for an admission round, work that becomes
        plannable within a round's time. Only `balanced` weighs it."""

    def observe(self, chunks: Sequence[tuple[int, int]], seconds: float) -> None:
        """A wave of (num_cached, num_new) chunks took `seconds` on its slowest stage."""


def align_down(value: int, block_size: int) -> int:
    return value // block_size * block_size


def chunk_of(req: Request, num_new: int, block_size: int) -> Chunk | None:
    """The next chunk of `req` with at most `num_new` tokens, its end aligned unless final."""
    start = req.num_scheduled_tokens
    end = start + num_new
    if end >= req.num_tokens:
        end = req.num_tokens
    else:
        end = align_down(end, block_size)
    if end <= start:
        return None
    return req.chunk(start, end)


def first_tokens(requests: Sequence[Request], num_tokens: int) -> list[tuple[int, int]]:
    """(num_cached, num_new) of the first `num_tokens` unscheduled tokens, FCFS, a chunk per
    request (block alignment left out: a cost estimate)."""
    shapes, left = [], num_tokens
    for req in requests:
        if left <= 0:
            break
        x = min(left, req.num_unscheduled_tokens)
        if x > 0:
            shapes.append((req.num_scheduled_tokens, x))
            left -= x
    return shapes


def pack_tokens(
    requests: Sequence[Request], budget: int, config: PlannerConfig, min_fragment: int
) -> list[Chunk]:
    """FCFS packing of up to `budget` tokens, at most `config.max_chunk_tokens` of them (where
    set) to one request. A request that does not fit whole is split only if the remaining
    budget is at least `min_fragment` (no tiny tail fragments)."""
    chunks: list[Chunk] = []
    left = budget
    for req in requests:
        if left <= 0 or len(chunks) >= config.max_chunks_per_wave:
            break
        need = req.num_unscheduled_tokens
        if config.max_chunk_tokens:
            need = min(need, config.max_chunk_tokens)
        if need > left and left < min_fragment:
            continue
        chunk = chunk_of(req, min(need, left), config.block_size)
        if chunk is not None:
            chunks.append(chunk)
            left -= chunk.num_tokens
    return align_chunk_ends(chunks, requests, config, max(0, left))
