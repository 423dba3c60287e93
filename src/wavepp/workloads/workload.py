"""The record every workload generator returns, and the cache-reuse ceiling of its order.

`ideal_hit_rate` is what an infinite cache could reuse, given the prompts in this order and
whole-block granularity:

    prompt p, n tokens, blocks of B:   [0, k*B) seen before as the same chained prefix
    reusable(p) = min(k*B, ((n - 1) // B) * B)

The cap keeps at least the block holding the final token computed (the runtime must produce
the first token), exactly as the leader's `Request.max_reusable_blocks` does. A block counts
as seen once any earlier prompt contained the same chain of blocks up to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from wavepp.cache import hash_blocks


@dataclass(frozen=True)
class Workload:
    """Prompts (token-id lists) in submission order, with optional open-loop arrival times.

    `block_size` is the granularity of `ideal_hit_rate` (and of reuse in the runtime).
    `arrival_times_s`: seconds from the start, one per prompt (None: closed loop).
    """

    name: str
    prompts: list[list[int]]
    block_size: int = 16
    arrival_times_s: tuple[float, ...] | None = None
    description: str = ""
    ideal_hit_rate: float = field(init=False)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"Workload.block_size must be positive, got {self.block_size}")
        if not self.prompts:
            raise ValueError(f"Workload {self.name!r}: no prompts")
        for i, prompt in enumerate(self.prompts):
            if len(prompt) == 0:
                raise ValueError(f"Workload {self.name!r}: prompt {i} is empty")
        if self.arrival_times_s is not None:
            if len(self.arrival_times_s) != len(self.prompts):
                raise ValueError(
                    f"Workload {self.name!r}: {len(self.arrival_times_s)} arrival "
                    f"times for {len(self.prompts)} prompts"
                )
            if any(t < 0 for t in self.arrival_times_s):
                raise ValueError(f"Workload {self.name!r}: negative arrival time")
        reusable = reusable_tokens(self.prompts, self.block_size)
        object.__setattr__(self, "ideal_hit_rate", sum(reusable) / self.num_tokens)

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def num_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    def __len__(self) -> int:
        return len(self.prompts)


def reusable_tokens(prompts: Sequence[Sequence[int]], block_size: int) -> list[int]:
    """Per prompt, the tokens an infinite cache could reuse (see the module docstring)."""
    seen: set[int] = set()
    out = []
    for prompt in prompts:
        hashes = hash_blocks(prompt, block_size)
        k = 0
        # chained hashes: hashes[k] seen means the whole prefix [0, (k+1)*B) was seen
        while k < len(hashes) and hashes[k] in seen:
            k += 1
        out.append(min(k * block_size, (len(prompt) - 1) // block_size * block_size))
        seen.update(hashes)
    return out


def ideal_hit_rate(prompts: Sequence[Sequence[int]], block_size: int) -> float:
    """Fraction of all prompt tokens that are reusable in this order."""
    total = sum(len(p) for p in prompts)
    return sum(reusable_tokens(prompts, block_size)) / total if total else 0.0


def snapshot_reusable_tokens(
    prompts: Sequence[Sequence[int]], block_size: int, interval_blocks: int
) -> list[int]:
    """Per prompt, what an infinite cache of a hybrid model could reuse: the reusable prefix
    (`reusable_tokens`) lowered to the last boundary where an earlier prompt saved a state
    snapshot (every `interval_blocks`-th block boundary it computed, and its last reusable
    boundary; see `cache.snapshot_plan`)."""
    snapshots: set[int] = set()
    out = []
    for prompt, reusable in zip(prompts, reusable_tokens(prompts, block_size)):
        hashes = hash_blocks(prompt, block_size)
        k = reusable // block_size
        while k and hashes[k - 1] not in snapshots:
            k -= 1
        out.append(k * block_size)
        last = (len(prompt) - 1) // block_size
        snapshots.update(
            hashes[b - 1] for b in range(interval_blocks, len(hashes) + 1, interval_blocks)
        )
        if last:
            snapshots.add(hashes[last - 1])
    return out


def ideal_snapshot_hit_rate(
    prompts: Sequence[Sequence[int]], block_size: int, interval_blocks: int
) -> float:
    """Fraction of all prompt tokens reusable at snapshot boundaries, in this order."""
    total = sum(len(p) for p in prompts)
    return (
        sum(snapshot_reusable_tokens(prompts, block_size, interval_blocks)) / total
        if total
        else 0.0
    )
