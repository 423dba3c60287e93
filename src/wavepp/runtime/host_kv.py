"""The bytes of one stage's host KV tier: copies of evicted blocks in host memory.

    host tensor (one per pool): [num_slots, num_pool_layers, block_size, width]
    stage pool tensor:          [num_pool_layers, num_blocks, block_size, width]

so block b of the stage is `pools.tensors[name][:, b]` and slot s here is `host[name][s]`.
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
        if pools.states:
            raise ValueError(
                "the runtime's host KV tier does not carry recurrent-state snapshots yet "
                f"({pools.layout.architecture} keeps them)"
            )
        self.pools = pools
        # bytes of one block over this stage's pools: layers x block_size x width x element
        self.block_bytes = sum(t[:, 0].numel() * t.element_size() for t in pools.tensors.values())
        self.num_slots = capacity_bytes // self.block_bytes
        pin = pools.device.type == "cuda"
        self.host = {
            name: torch.empty((self.num_slots, *t[:, 0].shape), dtype=t.dtype, pin_memory=pin)
            for name, t in pools.tensors.items()
        }
        self._free_slots = list(range(self.num_slots - 1, -1, -1))  # pop() takes slot 0 first
        self._slots: dict[int, int] = {}  # block hash -> slot

    def __len__(self) -> int:
        return len(self._slots)

    def put(self, block_hash: int, block_id: int) -> None:
        if block_hash in self._slots:
            raise ValueError(f"host KV: block {block_hash} is held already")
        if not self._free_slots:
            raise ValueError(f"host KV: no free slot for block {block_hash} ({self.num_slots})")
        slot = self._free_slots.pop()
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
        ids = torch.tensor(list(block_ids), dtype=torch.int64, device=self.pools.device)
        for name, tensor in self.pools.tensors.items():
            # [layers, num_blocks, block_size, width] at blocks `ids`
            blocks = staged[name].to(self.pools.device, non_blocking=True).transpose(0, 1)
            tensor.index_copy_(1, ids, blocks)

    def clear(self) -> None:
        """Hold nothing (the stage's cache was emptied); the tensors stay allocated."""
        self._free_slots = list(range(self.num_slots - 1, -1, -1))
        self._slots.clear()
