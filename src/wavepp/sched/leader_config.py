"""The leader's configuration: the pipeline's shape, its limits, and how chunks may overlap."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LeaderConfig:
    num_stages: int
    block_size: int = 16
    max_waves_in_flight: int | None = None  # default 2 * num_stages (the execution ring)
    max_round_requests: int = 64
    stage_num_blocks: tuple[int, ...] | None = None  # to fail prompts no stage could ever hold
    max_prompt_tokens: int | None = None  # to fail prompts past the model's positions
    hybrid: bool = False
    # a request's next chunk waits until its chunk in flight has come back (TensorRT-LLM's and
    # SGLang's in-flight request ids); False: chunks of one request may be in flight together
    serial_chunks: bool = False
    # the order of admission and of packing (sched/waiting.py): "fcfs" or "priority", and how
    # fast a waiting request's priority improves under "priority" (one step per aging_s)
    scheduling_policy: str = "fcfs"
    priority_aging_s: float = 10.0

    def __post_init__(self) -> None:
        if self.num_stages <= 0:
            raise ValueError(f"LeaderConfig.num_stages must be positive, got {self.num_stages}")
        if self.block_size <= 0:
            raise ValueError(f"LeaderConfig.block_size must be positive, got {self.block_size}")
        if self.max_waves_in_flight is not None and self.max_waves_in_flight <= 0:
            raise ValueError("LeaderConfig.max_waves_in_flight must be positive")
        if self.max_round_requests <= 0:
            raise ValueError("LeaderConfig.max_round_requests must be positive")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens <= 0:
            raise ValueError("LeaderConfig.max_prompt_tokens must be positive")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                "LeaderConfig.scheduling_policy must be 'fcfs' or 'priority', got "
                f"{self.scheduling_policy!r}"
            )
        if not self.priority_aging_s > 0:
            raise ValueError("LeaderConfig.priority_aging_s must be positive")
        if self.stage_num_blocks is not None and len(self.stage_num_blocks) != self.num_stages:
            raise ValueError(
                f"LeaderConfig.stage_num_blocks has {len(self.stage_num_blocks)} "
                f"entries for {self.num_stages} stages"
            )

    @property
    def waves_in_flight_cap(self) -> int:
        return self.max_waves_in_flight or 2 * self.num_stages
