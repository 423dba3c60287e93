"""Every stage of a model in one process, chained: the single-process reference path.

`LocalPipeline` builds the stage slices of a model split into `num_stages` and runs a batch
through them in order, each stage with its own paged KV cache, all with one `Kernels`. It keeps a block table per
request with a trivial allocator, so tests can feed prompts chunk by chunk. The real runtime
puts each stage in its own process, with its own block manager; here one allocator serves all
stages, so a request uses the same block ids on each. (The bench's `single-stage` baseline is
not this: it is the real runtime with one stage, `Engine(pp=1)`.)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Hashable, Sequence

import torch

from wavepp.models.batch import ChunkSpec, StageBatch
from wavepp.models.kernels import Kernels
from wavepp.models.loader import load_stage_model
from wavepp.models.registry import load_model_config
from wavepp.models.spec import stage_specs


class LinearBlockAllocator:
    """Free block ids, lowest first. No prefix sharing, no eviction: a reference helper."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` free ids (lowest first). Raises RuntimeError if too few are free."""
        if num_blocks > len(self._free):
            raise RuntimeError(
                f"out of KV cache blocks: {num_blocks} needed, {len(self._free)} free "
                f"of {self.num_blocks}"
            )
        return [heapq.heappop(self._free) for _ in range(num_blocks)]

    def free(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            heapq.heappush(self._free, block_id)

    def check_integrity(self) -> None:
        assert len(set(self._free)) == len(self._free), "a block is free twice"
        assert all(0 <= b < self.num_blocks for b in self._free), "a free block id is out of range"


@dataclass
class _Request:
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0


class LocalPipeline:
    """The stages of the model at `model_path`, split into `num_stages`, chained in-process."""

    def __init__(
        self,
        model_path: str | Path,
        num_stages: int = 1,
        dtype: torch.dtype = torch.float32,
        num_blocks: int = 256,
        block_size: int = 16,
        kernels: Kernels | None = None,
    ) -> None:
        self.config = load_model_config(model_path)
        self.block_size = block_size
        self.kernels = kernels or Kernels()
        self.stages = [
            load_stage_model(model_path, spec, dtype)
            for spec in stage_specs(self.config.num_layers, num_stages)
        ]
        self.caches = [stage.new_kv_cache(num_blocks, block_size) for stage in self.stages]
        self.allocator = LinearBlockAllocator(num_blocks)
        self._requests: dict[Hashable, _Request] = {}

    def run(self, batch: StageBatch, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [batch.num_tokens] -> logits of each chunk's last token [num_chunks, vocab]."""
        hidden = self.stages[0](batch, self.caches[0], input_ids=input_ids, kernels=self.kernels)
        for stage, cache in zip(self.stages[1:], self.caches[1:]):
            hidden = stage(batch, cache, hidden_states=hidden, kernels=self.kernels)
        return hidden

    def prefill_chunks(self, chunks: Sequence[tuple[Hashable, Sequence[int]]]) -> torch.Tensor:
        """One forward over several requests' next chunks: (request_id, token_ids) each, at most
        one chunk per request. A new request id starts at position 0. Grows block tables as
        needed; returns logits of each chunk's last token [num_chunks, vocab] (fp32)."""
        if len({request_id for request_id, _ in chunks}) != len(chunks):
            raise ValueError("at most one chunk per request in one batch")
        specs, token_ids = [], []
        for request_id, tokens in chunks:
            if len(tokens) == 0:
                raise ValueError(f"chunk of request {request_id!r} is empty")
            state = self._requests.setdefault(request_id, _Request())
            end = state.num_cached_tokens + len(tokens)
            missing = -(-end // self.block_size) - len(state.block_table)
            if missing > 0:
                state.block_table += self.allocator.allocate(missing)
            specs.append(
                ChunkSpec(
                    state.num_cached_tokens, len(tokens), tuple(state.block_table), request_id
                )
            )
            token_ids.extend(int(t) for t in tokens)
        logits = self.run(
            StageBatch.build(specs, self.block_size), torch.tensor(token_ids, dtype=torch.int64)
        )
        for request_id, tokens in chunks:
            self._requests[request_id].num_cached_tokens += len(tokens)
        return logits

    def prefill(
        self,
        request_id: Hashable,
        token_ids: Sequence[int],
        chunk_sizes: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Feed `token_ids` after the request's cached tokens, in chunks of `chunk_sizes`
        (default: one chunk). Returns the last token's logits [vocab] (fp32)."""
        if len(token_ids) == 0:
            raise ValueError(f"prompt of request {request_id!r} is empty")
        chunk_sizes = list(chunk_sizes or [len(token_ids)])
        if sum(chunk_sizes) != len(token_ids) or min(chunk_sizes) < 1:
            raise ValueError(
                f"chunk_sizes {chunk_sizes} must be positive and sum to the {len(token_ids)} tokens"
            )
        start = 0
        for size in chunk_sizes:
            logits = self.prefill_chunks([(request_id, token_ids[start : start + size])])
            start += size
        return logits[0]

    def num_cached_tokens(self, request_id: Hashable) -> int:
        return self._requests[request_id].num_cached_tokens if request_id in self._requests else 0

    def block_table(self, request_id: Hashable) -> list[int]:
        return list(self._requests[request_id].block_table)

    def release(self, request_id: Hashable) -> None:
        """Forget the request and free its blocks."""
        self.allocator.free(self._requests.pop(request_id).block_table)
