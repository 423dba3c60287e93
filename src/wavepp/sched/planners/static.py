"""The static planner: a fixed token budget per wave (vLLM's max_num_batched_tokens style)."""

from __future__ import annotations

from typing import Sequence

from wavepp.sched.messages import Chunk
from wavepp.sched.planners.base import NOTHING_ADMITTING, Admitting, PlannerConfig, pack_tokens
from wavepp.sched.request import Request


class StaticPlanner:
    name = "static"

    def __init__(self, config: PlannerConfig):
        self.config = config

    def plan(
        self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING
    ) -> list[Chunk]:
        return pack_tokens(
            requests, self.config.static_wave_tokens, self.config, self.config.block_size
        )

    def observe(self, chunks, seconds: float) -> None:
        pass
