"""The paged KV cache of one stage: K and V of its layers in fixed-size blocks.

One tensor holds the keys of all the stage's layers, one the values:

    key, value: [num_layers, num_blocks, block_size, num_kv_heads, head_dim]

Which block holds which request's positions is not known here: the block manager decides,
and the model reads and writes through the slot indices of a `StageBatch`
(slot = block_id * block_size + offset). Layer i of the cache is layer `start_layer + i` of
the model.
"""

from __future__ import annotations

import torch

from wavepp.models.config import ModelConfig, StageSpec


class PagedKVCache:
    """Zero-initialised K/V blocks for `num_layers` layers. Holds tensors only, no bookkeeping."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu") -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks),
                            ("block_size", block_size), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"PagedKVCache.{name} must be >= 1, got {value}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.key = torch.zeros(shape, dtype=dtype, device=device)
        self.value = torch.zeros(shape, dtype=dtype, device=device)

    @classmethod
    def for_stage(cls, config: ModelConfig, stage: StageSpec, num_blocks: int, block_size: int,
                  dtype: torch.dtype = torch.bfloat16,
                  device: torch.device | str = "cpu") -> PagedKVCache:
        """A cache shaped for the layers of `stage`."""
        return cls(stage.num_stage_layers, num_blocks, block_size, config.num_kv_heads,
                   config.head_dim, dtype, device)

    @property
    def dtype(self) -> torch.dtype:
        return self.key.dtype

    @property
    def device(self) -> torch.device:
        return self.key.device

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_bytes(self) -> int:
        return 2 * self.key.numel() * self.key.element_size()

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat views of the stage's `index`-th layer, written in place by the model.

        Returns (key, value), each [num_blocks * block_size, num_kv_heads, head_dim].
        """
        flat = (self.num_slots, self.num_kv_heads, self.head_dim)
        return self.key[index].view(flat), self.value[index].view(flat)

    def read_block(self, layer: int, block_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one block, each [block_size, num_kv_heads, head_dim] (views)."""
        return self.key[layer, block_id], self.value[layer, block_id]

    def __repr__(self) -> str:
        return (f"PagedKVCache(num_layers={self.num_layers}, num_blocks={self.num_blocks}, "
                f"block_size={self.block_size}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype})")
