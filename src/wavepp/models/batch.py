"""The input record of one stage forward: a flat batch of request chunks over a paged KV cache.

A chunk is the next `num_tokens` tokens of one request whose first `num_cached_tokens` tokens
already have K/V in this stage's cache. Its block table lists the cache blocks that hold
positions [0, num_cached_tokens + num_tokens), in order: position p lives in block
`block_table[p // block_size]` at offset `p % block_size` (its "slot" is
`block_id * block_size + offset`). The block ids come from the stage's block manager.

    chunk i:  [0, num_cached_tokens)  K/V read from the cache  |  [num_cached_tokens, end)  computed now

A hybrid model's linear-attention layers start the chunk from the state saved in slot
`state_in` (the state after [0, num_cached_tokens); None: the zero state of an empty prefix)
and save the state after [0, p) into slot s for each (p, s) of `state_saves`:

    num_cached_tokens ... p1 ... p2 ... end      saves at p1, p2 (and end, to go on from there)
    batch:    tokens of chunk 0 | tokens of chunk 1 | ...   (flat, token_starts[i] marks chunk i)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import torch


@dataclass(frozen=True)
class ChunkSpec:
    """The next `num_tokens` tokens of one request after `num_cached_tokens` cached ones."""

    num_cached_tokens: int
    num_tokens: int
    block_table: tuple[int, ...]  # block ids covering [0, num_cached_tokens + num_tokens)
    request_id: Hashable = None  # only used in error messages
    state_in: int | None = None  # state slot to start from (hybrid models)
    state_saves: tuple[
        tuple[int, int], ...
    ] = ()  # (position, state slot), positions non-decreasing

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_table", tuple(int(b) for b in self.block_table))
        object.__setattr__(
            self, "state_saves", tuple((int(p), int(s)) for p, s in self.state_saves)
        )
        positions = [p for p, _ in self.state_saves]
        if positions != sorted(positions) or any(
            not self.num_cached_tokens < p <= self.end for p in positions
        ):
            raise ValueError(
                f"chunk of request {self.request_id!r}: state_saves {list(self.state_saves)} "
                f"need non-decreasing positions in ({self.num_cached_tokens}, {self.end}]"
            )
        if self.num_tokens < 1:
            raise ValueError(
                f"chunk of request {self.request_id!r} is empty (num_tokens="
                f"{self.num_tokens}); every chunk computes at least one token"
            )
        if self.num_cached_tokens < 0:
            raise ValueError(
                f"chunk of request {self.request_id!r} has num_cached_tokens="
                f"{self.num_cached_tokens} < 0"
            )
        if any(b < 0 for b in self.block_table):
            raise ValueError(
                f"chunk of request {self.request_id!r} has a negative block id in "
                f"its block table {list(self.block_table)}"
            )

    @property
    def end(self) -> int:
        """One past the last position this chunk computes."""
        return self.num_cached_tokens + self.num_tokens


@dataclass(frozen=True)
class StageBatch:
    """One wave's chunks on one stage, with the index tensors every layer shares.

    Build it with `StageBatch.build(chunks, block_size)`; it validates that each block table
    covers its chunk and that no two tokens of the batch write the same cache slot. Its tensors
    are built on the host; `to(device)` gives the batch a model on a GPU reads (and every mask
    it makes later is made on that device).
    """

    chunks: tuple[ChunkSpec, ...]
    block_size: int
    token_starts: tuple[int, ...]  # [num_chunks + 1]: chunk i owns flat tokens [s[i], s[i+1])
    context_starts: tuple[int, ...]  # [num_chunks + 1]: chunk i's context slots [c[i], c[i+1])
    positions: torch.Tensor  # [num_tokens] int64, position of each new token
    slot_mapping: torch.Tensor  # [num_tokens] int64, cache slot each new token's K/V goes to
    context_slots: torch.Tensor  # [sum of chunk ends] int64, slots of [0, end) per chunk
    last_token_indices: torch.Tensor  # [num_chunks] int64, flat index of each chunk's last token
    causal_mask: torch.Tensor  # [n, n] bool, n = longest chunk: True where key j > query i
    cu_tokens: torch.Tensor  # [num_chunks + 1] int32, token_starts (varlen kernels)
    cu_context: torch.Tensor  # [num_chunks + 1] int32, context_starts (varlen kernels)
    max_block_id: int
    max_position: int
    _biases: dict = field(
        default_factory=dict, repr=False, compare=False
    )  # per dtype / chunk, made once

    @property
    def num_tokens(self) -> int:
        return self.token_starts[-1]

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    @property
    def device(self) -> torch.device:
        return self.positions.device

    @property
    def max_chunk_tokens(self) -> int:
        return self.causal_mask.shape[0]

    def to(self, device: torch.device | str) -> StageBatch:
        """This batch with its tensors on `device` (itself when they are there already): one
        non-blocking copy per index tensor, once per wave, shared by every layer."""
        device = torch.device(device)
        if self.device == device:
            return self

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        return dataclasses.replace(
            self,
            positions=move(self.positions),
            slot_mapping=move(self.slot_mapping),
            context_slots=move(self.context_slots),
            last_token_indices=move(self.last_token_indices),
            causal_mask=move(self.causal_mask),
            cu_tokens=move(self.cu_tokens),
            cu_context=move(self.cu_context),
            _biases={},
        )

    def causal_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """causal_mask as an additive bias (0 or -inf) in `dtype`, made once per dtype: every
        layer adds it to its scores, which is cheaper than a masked fill."""
        if dtype not in self._biases:
            zeros = torch.zeros(self.causal_mask.shape, dtype=dtype, device=self.device)
            self._biases[dtype] = zeros.masked_fill_(self.causal_mask, float("-inf"))
        return self._biases[dtype]

    def memo(self, key: Hashable, make):
        """`make()` made once per batch under `key` and kept with it: what a kernel derives from
        the batch and every layer reads (index tensors in its own form)."""
        key = ("memo", key)
        if key not in self._biases:
            self._biases[key] = make()
        return self._biases[key]

    def visible_mask(self, index: int) -> torch.Tensor:
        """Which context positions each new token of chunk `index` sees: [num_tokens, end]
        bool, True where visible, made once per chunk (every layer reads it):

            new token i (position num_cached + i):  [0, num_cached + i]  visible  |  rest hidden
        """
        key = ("visible", index)
        if key not in self._biases:
            chunk = self.chunks[index]
            self._biases[key] = torch.ones(
                chunk.num_tokens, chunk.end, dtype=torch.bool, device=self.device
            ).tril_(chunk.num_cached_tokens)
        return self._biases[key]

    def shared_prefixes(self, min_tokens: int) -> list[tuple[tuple[int, ...], int]]:
        """Chunks that read the same cached blocks first: (chunk indices, shared prefix tokens)
        for every group of two or more chunks whose block tables start with the same blocks,
        all cached for each of them, at least `min_tokens` long. A chunk is in one group at
        most; the groups' prefix lengths are whole blocks.

            chunk a:  [ shared blocks | a's own cached | a's new ]
            chunk b:  [ shared blocks | b's new ]                  prefix = shared blocks
        """
        bs = self.block_size
        order = sorted(range(self.num_chunks), key=lambda i: self.chunks[i].block_table)
        groups, start = [], 0
        while start < len(order):
            first = self.chunks[order[start]]
            limit = first.num_cached_tokens // bs  # blocks it holds cached
            end, prefix = start + 1, limit
            while end < len(order):
                other = self.chunks[order[end]]
                common = _common_blocks(
                    first.block_table, other.block_table, min(prefix, other.num_cached_tokens // bs)
                )
                if common * bs < max(min_tokens, 1):
                    break
                prefix, end = common, end + 1
            if end - start >= 2:
                groups.append((tuple(sorted(order[start:end])), prefix * bs))
            start = end
        return groups

    @classmethod
    def build(cls, chunks: Sequence[ChunkSpec], block_size: int) -> StageBatch:
        """Derive the shared index tensors. Raises ValueError on an empty batch, a block table
        too short for its chunk, two new tokens mapped to one cache slot, or a new token mapped
        to a slot that a chunk of the batch reads as cached (a shared prefix block)."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not chunks:
            raise ValueError("a StageBatch needs at least one chunk")
        token_starts, context_starts = [0], [0]
        positions, slots, contexts, max_block_id = [], [], [], 0
        # Per chunk, not per token: the slots of [0, end) come from one broadcast over blocks.
        offsets = torch.arange(block_size, dtype=torch.int64)
        for index, chunk in enumerate(chunks):
            num_blocks = -(-chunk.end // block_size)
            if len(chunk.block_table) < num_blocks:
                raise ValueError(
                    f"block table of chunk {index} (request {chunk.request_id!r}) has "
                    f"{len(chunk.block_table)} blocks of {block_size} tokens; positions "
                    f"[0, {chunk.end}) need {num_blocks}"
                )
            table = torch.tensor(chunk.block_table[:num_blocks], dtype=torch.int64)
            # context: [end] slot of every position in [0, end)
            context = (table[:, None] * block_size + offsets).flatten()[: chunk.end]
            contexts.append(context)
            slots.append(context[chunk.num_cached_tokens :])
            positions.append(torch.arange(chunk.num_cached_tokens, chunk.end, dtype=torch.int64))
            token_starts.append(token_starts[-1] + chunk.num_tokens)
            context_starts.append(context_starts[-1] + chunk.end)
            max_block_id = max(max_block_id, int(table.max()))
        slot_mapping = torch.cat(slots)
        _check_writes(
            slot_mapping, [c[: chunk.num_cached_tokens] for c, chunk in zip(contexts, chunks)]
        )
        longest = max(chunk.num_tokens for chunk in chunks)
        return cls(
            chunks=tuple(chunks),
            block_size=block_size,
            token_starts=tuple(token_starts),
            context_starts=tuple(context_starts),
            positions=torch.cat(positions),
            slot_mapping=slot_mapping,
            context_slots=torch.cat(contexts),
            last_token_indices=torch.tensor(token_starts[1:], dtype=torch.int64) - 1,
            causal_mask=torch.ones(longest, longest, dtype=torch.bool).triu_(1),
            cu_tokens=torch.tensor(token_starts, dtype=torch.int32),
            cu_context=torch.tensor(context_starts, dtype=torch.int32),
            max_block_id=max_block_id,
            max_position=max(chunk.end for chunk in chunks) - 1,
        )


def _common_blocks(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = 0
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def _check_writes(slot_mapping: torch.Tensor, cached: list[torch.Tensor]) -> None:
    # Prefix blocks may be shared between requests (read-only); new K/V must land in slots
    # no other token writes and no chunk reads as cached.
    if torch.unique(slot_mapping).numel() != slot_mapping.numel():
        raise ValueError(
            "two tokens of the batch map to the same cache slot: "
            "the block tables of its chunks overlap on new positions"
        )
    cached_slots = torch.cat(cached)
    if cached_slots.numel() and bool(torch.isin(slot_mapping, cached_slots).any()):
        raise ValueError(
            "a new token of the batch maps to a cache slot that a chunk reads as "
            "cached: it would overwrite a (shared) prefix block"
        )
