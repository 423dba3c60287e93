"""Host seconds per iteration of the outside loops (sim/loops/loop_sim.py), on each rank."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LoopCosts:
    """Host seconds per iteration of an outside loop, on each rank.

    Defaults: `schedule_item_s` is TensorRT-LLM's measured host step over its requests
    (NVIDIA/TensorRT-LLM#10273: 45.11 ms per iteration for a 1,536-request decode batch, 29 us
    per request, the scheduler 4.4% of it); `schedule_s` the ~580 us of host work per iteration
    that NVIDIA/TensorRT-LLM#13957 measures exposed as GPU idle in its executor loop (decode);
    `match_block_s` and `alloc_block_s` are this project's BlockPool per block (lease 0.66 us,
    reserve + commit 4.9 us on the 2-core VM, scaled 1.4x to a server core, as in
    AdmissionCosts), charged per KV block of `block_tokens` (TensorRT-LLM's default
    tokens_per_block, 32); `hop_s`, `fetch_s`, `relay_s` and `finalize_s` are assumptions
    taken from this project's admission costs (AdmissionCosts: 100 us one way, 50 us of work
    per message).
    """

    fetch_s: float = 50e-6  # read the queue / unpickle the request list
    schedule_s: float = 580e-6  # the scheduler and loop bookkeeping per iteration
    schedule_item_s: float = 29e-6  # ... per request in the microbatch
    match_block_s: float = 0.5e-6  # prefix match, per cached block (each rank)
    alloc_block_s: float = 3.5e-6  # KV allocation, per new block (each rank)
    relay_s: float = 50e-6  # (de)serialize and post one message
    hop_s: float = 100e-6  # one way between neighbouring ranks
    finalize_s: float = 50e-6  # retire a microbatch (responses, free KV)
    block_tokens: int = 32  # real tokens per block of the per-block costs

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0:
                raise ValueError(f"LoopCosts.{name} must be >= 0, got {value}")
        if self.block_tokens <= 0:
            raise ValueError("LoopCosts.block_tokens must be positive")

    def scaled(self, token_scale: int) -> "LoopCosts":
        """The same costs for blocks of `token_scale` times fewer (simulated) tokens."""
        return LoopCosts(
            **{**asdict(self), "block_tokens": max(1, self.block_tokens // token_scale)}
        )
