"""The bytes of one stage's host KV tier: copies of evicted blocks in host memory.

    host tensor (one per pool): [num_slots, num_pool_layers, block_size, width]
    stage pool tensor:          [num_pool_layers, num_blocks, block_size, width]

so block b of the stage is `pools.tensors[name][:, b]` and slot s here is `host[name][s]`. A
hybrid model's snapshots (`pools.states[name][slot]`: [layers, elements]) are copied into host
tensors of their own, one per snapshot held.
`HostTier` (cache/host_tier.py) keeps the bookkeeping, the one LRU, and calls this store
(`HostBlockStore`) when it starts holding a block (put: a copy out of the pools), lets one go
(drop: its slot is free), loads some back (stage: a copy of their slots, taken at once) and
lands them (load: into the request's new blocks). It holds no order of its own: a slot per
hash, a free list. Who calls it: the stage's evictions (prepare on the LOOP thread, a host
lease's materialize on the WAVE thread, both under the stage lock), before the wave or the
load that overwrites the evicted block.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from wavepp.models.paged_pools import PagedPools


class HostKVStore:
    """Room for `capacity_bytes // block_bytes` blocks of `pools`, in host memory (pinned when
    the pools are on a GPU). Implements `wavepp.cache.HostBlockStore`."""

    def __init__(self, pools: PagedPools, capacity_bytes: int) -> None:
        self.pools = pools
        # bytes of one block over this stage's pools: layers x block_size x width x element
        # (at least 1: a stage of linear-attention layers only has no KV pool, only states,
        # and the tier still counts its blocks)
        self.block_bytes = max(
            1, sum(t[:, 0].numel() * t.element_size() for t in pools.tensors.values())
        )
        self.num_slots = capacity_bytes // self.block_bytes
        pin = pools.device.type == "cuda"
        self.host = {
            name: torch.empty((self.num_slots, *t[:, 0].shape), dtype=t.dtype, pin_memory=pin)
            for name, t in pools.tensors.items()
        }
        self._free_slots: list[int] = []  # given back; below _next_slot, never used yet
        self._next_slot = 0
        self._slots: dict[int, int] = {}  # block hash -> slot
        # hybrid models: block hash -> the snapshot after it, one host tensor per state
        # (copied at put: snapshots are few, and the tier's LRU bounds their bytes)
        self._states: dict[int, dict[str, torch.Tensor]] = {}
        self.snapshot_bytes = sum(t[0].numel() * t.element_size() for t in pools.states.values())

    def __len__(self) -> int:
        return len(self._slots)

    def put(self, block_hash: int, block_id: int) -> None:
        if block_hash in self._slots:
            raise ValueError(f"host KV: block {block_hash} is held already")
        if not self._free_slots and self._next_slot >= self.num_slots:
            raise ValueError(f"host KV: no free slot for block {block_hash} ({self.num_slots})")
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot, self._next_slot = self._next_slot, self._next_slot + 1
        for name, host in self.host.items():
            # [layers, block_size, width] <- block block_id of every layer of the pool
            host[slot].copy_(self.pools.tensors[name][:, block_id])
        self._slots[block_hash] = slot

    def drop(self, block_hash: int) -> None:
        self._free_slots.append(self._slots.pop(block_hash))

    def stage(self, block_hashes: Sequence[int]) -> dict[str, torch.Tensor]:
        """name -> [num_blocks, layers, block_size, width], a copy (indexing copies)."""
        slots = torch.tensor([self._slots[h] for h in block_hashes], dtype=torch.int64)
        return {name: host[slots] for name, host in self.host.items()}

    def load(self, staged: object, block_ids: Sequence[int]) -> None:
        assert isinstance(staged, dict)
        self.pools.write_blocks(staged, block_ids)

    def put_state(self, block_hash: int, slot: int) -> None:
        if block_hash in self._states:
            raise ValueError(f"host KV: the state after block {block_hash} is held already")
        # [layers, elements] of every state at `slot`, copied to the host
        self._states[block_hash] = {
            name: t[slot].to("cpu", copy=True) for name, t in self.pools.states.items()
        }

    def drop_state(self, block_hash: int) -> None:
        del self._states[block_hash]

    def stage_states(self, block_hashes: Sequence[int]) -> dict[str, torch.Tensor]:
        """name -> [num_states, layers, elements], a copy."""
        return {
            name: torch.stack([self._states[h][name] for h in block_hashes])
            for name in self.pools.states
        }

    def load_states(self, staged: object, slots: Sequence[int]) -> None:
        assert isinstance(staged, dict)
        self.pools.write_states(staged, slots)

    def stage_blocks(self, block_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        return self.pools.copy_blocks(block_ids)

    def clear(self) -> None:
        """Hold nothing (the stage's cache was emptied); the tensors stay allocated."""
        self._free_slots, self._next_slot = [], 0
        self._slots.clear()
        self._states.clear()
