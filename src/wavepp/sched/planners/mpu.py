"""The paper's MPU planner: budget halving with hysteresis, from the available work."""

from __future__ import annotations

from typing import Sequence

from wavepp.sched.messages import Chunk
from wavepp.sched.planners.base import (
    NOTHING_ADMITTING,
    Admitting,
    PlannerConfig,
    align_down,
    pack_tokens,
)
from wavepp.sched.request import Request


class MpuPlanner:
    """The paper's MPU planner.

    Execution ring R = 2P, target S = R + (F-1)P waves (F = 2). Candidate budgets halve from M
    down to b_min (block aligned; `PlannerConfig.mpu_budgets`, the paper's 16,384 and 8,192).
    With W admitted-but-unscheduled tokens and N_{>b/2} requests holding more than b/2 of them,
    budget b supports n(b) = max(W/b, N_{>b/2}) waves; the planner proposes the largest b with
    n(b) >= S (else b_min). Hysteresis: it raises its budget after R/2 consecutive proposals
    above it, lowers it after P below it.

    State: `budget` and the two streaks, moved by every `plan` call (through `decide`).
    """

    name = "mpu"

    def __init__(self, config: PlannerConfig, fill_factor: int = 2):
        self.config = config
        p = config.num_stages
        self.ring = 2 * p
        self.target_waves = self.ring + (fill_factor - 1) * p
        self.budgets = budget_ladder(*config.mpu_budgets, config.block_size)
        self.budget = self.budgets[0]
        self._streak_up = 0
        self._streak_down = 0

    def propose(self, requests: Sequence[Request]) -> int:
        work = sum(r.num_unscheduled_tokens for r in requests)
        for b in self.budgets:  # largest first
            n_long = sum(1 for r in requests if r.num_unscheduled_tokens > b / 2)
            if max(work / b, n_long) >= self.target_waves:
                return b
        return self.budgets[-1]

    def decide(self, proposal: int) -> int:
        """Apply hysteresis to a proposal; returns the budget in force."""
        if proposal > self.budget:
            self._streak_up, self._streak_down = self._streak_up + 1, 0
            if self._streak_up >= max(1, self.ring // 2):
                self.budget, self._streak_up = proposal, 0
        elif proposal < self.budget:
            self._streak_down, self._streak_up = self._streak_down + 1, 0
            if self._streak_down >= self.config.num_stages:
                self.budget, self._streak_down = proposal, 0
        else:
            self._streak_up = self._streak_down = 0
        return self.budget

    def plan(
        self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING
    ) -> list[Chunk]:
        b = self.decide(self.propose(requests))
        return pack_tokens(requests, b, self.config, max(self.budgets[-1], b // 2))

    def observe(self, chunks, seconds: float) -> None:
        pass


def budget_ladder(max_tokens: int, min_tokens: int, block_size: int) -> list[int]:
    """M, M/2, M/4, ... down to b_min, each aligned to the block size (at least one block)."""
    floor = max(block_size, align_down(min_tokens, block_size))
    ladder, b = [], max(floor, align_down(max_tokens, block_size))
    while b > floor:
        ladder.append(b)
        b = max(floor, align_down(b // 2, block_size))
    ladder.append(floor)
    return ladder
