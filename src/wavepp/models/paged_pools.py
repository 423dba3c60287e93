"""The paged cache of one stage, laid out by a `PageLayout`: one tensor per pool.

    pool tensor: [num_pool_layers, num_blocks, block_size, width]   (its layers in this stage)

All pools share block ids: block b of every pool holds the same tokens, so the block manager
caches, leases, escrows and evicts a block with everything the layers keep about it. The
model reads and writes through the slot indices of a `StageBatch` (slot = block * size + offset).

A hybrid model's linear-attention layers keep snapshots instead, one per *state slot*:

    state tensor: [num_state_slots, num_state_layers, elements]   (recurrent: fp32; conv: dtype)

A chunk reads its starting state from one slot and saves states into others (`ChunkSpec`);
which slot belongs to which block boundary is the block manager's business.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from wavepp.models.spec import PageLayout, StageSpec


class PagedPools:
    """Zero-initialised pools for the layers [stage.start_layer, stage.end_layer). Tensors only."""

    def __init__(
        self,
        layout: PageLayout,
        stage: StageSpec,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        num_state_slots: int = 0,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"PagedPools needs num_blocks >= 1 and block_size >= 1, got "
                f"{num_blocks}, {block_size}"
            )
        self.layout = layout
        self.stage = stage
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.tensors: dict[str, torch.Tensor] = {}
        # (pool name, model layer) -> index into that pool's tensor
        self._index: dict[tuple[str, int], int] = {}
        for pool in layout.pools:
            layers = [i for i in pool.layers if stage.start_layer <= i < stage.end_layer]
            if not layers:
                continue
            self.tensors[pool.name] = torch.zeros(
                len(layers), num_blocks, block_size, pool.width, dtype=dtype, device=device
            )
            self._index.update({(pool.name, layer): j for j, layer in enumerate(layers)})
        if layout.states and num_state_slots < 1:
            raise ValueError(
                f"{layout.architecture} keeps state snapshots: num_state_slots must be >= 1"
            )
        self.num_state_slots = num_state_slots
        self.states: dict[str, torch.Tensor] = {}
        for state in layout.states:
            layers = [i for i in state.layers if stage.start_layer <= i < stage.end_layer]
            if not layers:
                continue
            self.states[state.name] = torch.zeros(
                num_state_slots,
                len(layers),
                state.elements,
                dtype=torch.float32 if state.fp32 else dtype,
                device=device,
            )
            self._index.update({(state.name, layer): j for j, layer in enumerate(layers)})

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_bytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in [*self.tensors.values(), *self.states.values()]
        )

    def has(self, name: str, layer: int) -> bool:
        return (name, layer) in self._index

    def view(self, name: str, layer: int) -> torch.Tensor:
        """Flat view [num_slots, width] of pool `name` for model layer `layer`, written in place."""
        if (name, layer) not in self._index:
            raise KeyError(
                f"no pool {name!r} for layer {layer} in this stage's cache "
                f"(layers [{self.stage.start_layer}, {self.stage.end_layer}))"
            )
        tensor = self.tensors[name][self._index[(name, layer)]]
        return tensor.view(self.num_slots, tensor.shape[-1])

    def state_view(self, name: str, layer: int) -> torch.Tensor:
        """[num_state_slots, elements] of state `name` for model layer `layer`, written in place."""
        if name not in self.states or (name, layer) not in self._index:
            raise KeyError(f"no state {name!r} for layer {layer} in this stage's cache")
        return self.states[name][:, self._index[(name, layer)]]

    def copy_blocks(self, block_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        """A copy of blocks `block_ids`, per pool: [num_blocks, layers, block_size, width], on
        this cache's device. Later writes to the blocks do not change it."""
        ids = self._ids(block_ids)
        return {
            name: t.index_select(1, ids).transpose(0, 1).contiguous()
            for name, t in self.tensors.items()
        }

    def write_blocks(self, blocks: dict[str, torch.Tensor], block_ids: Sequence[int]) -> None:
        """Write `blocks` (as `copy_blocks` gives them, on any device) into blocks `block_ids`."""
        ids = self._ids(block_ids)
        for name, tensor in self.tensors.items():
            # [layers, num_blocks, block_size, width] at blocks `ids`
            tensor.index_copy_(
                1, ids, blocks[name].to(self.device, non_blocking=True).transpose(0, 1)
            )

    def write_states(self, states: dict[str, torch.Tensor], slots: Sequence[int]) -> None:
        """Write `states` (per state pool [num_states, layers, elements]) into state `slots`."""
        ids = self._ids(slots)
        for name, tensor in self.states.items():
            tensor.index_copy_(0, ids, states[name].to(self.device, non_blocking=True))

    def export_rows(
        self, block_table: list[int], num_tokens: int
    ) -> dict[str, tuple[list[int], torch.Tensor]]:
        """A copy, on the host, of tokens [0, num_tokens) held in `block_table`'s blocks, per pool:
        {pool: (its model layers in this stage, [layers, num_tokens, width])}. Later writes to
        the blocks do not change it."""
        index = self._block_index(block_table, num_tokens)
        out = {}
        for name, tensor in self.tensors.items():
            layers = self._layers(name)
            # [layers, num_blocks, block_size, width] -> [layers, num_tokens, width]
            rows = tensor.index_select(1, index).flatten(1, 2)[:, :num_tokens]
            out[name] = (layers, rows.cpu().contiguous())
        return out

    def export_shapes(self, num_tokens: int) -> dict[str, tuple[list[int], tuple, torch.dtype]]:
        """What `export_blocks_into` fills for a request of `num_tokens`, per pool: (its model
        layers in this stage, [layers, num_blocks, block_size, width], dtype): whole blocks, the
        last one's rows past `num_tokens` whatever the pool held there."""
        num_blocks = -(-num_tokens // self.block_size)
        return {
            name: (
                self._layers(name),
                (tensor.shape[0], num_blocks, self.block_size, tensor.shape[-1]),
                tensor.dtype,
            )
            for name, tensor in self.tensors.items()
        }

    def export_blocks_into(
        self, block_table: list[int], num_tokens: int, out: dict[str, torch.Tensor]
    ) -> None:
        """Copy the blocks holding tokens [0, num_tokens) into `out` ({pool: a host tensor of
        `export_shapes`' shape}): one copy, straight from the pools (a staging arena's)."""
        index = self._block_index(block_table, num_tokens)
        for name, tensor in self.tensors.items():
            if tensor.device.type == "cpu":
                torch.index_select(tensor, 1, index, out=out[name])
            else:
                out[name].copy_(tensor.index_select(1, index))

    def _ids(self, indices: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(indices), dtype=torch.int64, device=self.device)

    def _block_index(self, block_table: list[int], num_tokens: int) -> torch.Tensor:
        """The blocks holding tokens [0, num_tokens), as an index on the pools' device."""
        num_blocks = -(-num_tokens // self.block_size)
        if num_blocks > len(block_table):
            raise ValueError(
                f"{num_tokens} tokens need {num_blocks} blocks; the table has {len(block_table)}"
            )
        return torch.tensor(block_table[:num_blocks], dtype=torch.int64, device=self.device)

    def _layers(self, name: str) -> list[int]:
        """The model layers pool `name` holds in this stage, in order."""
        return sorted(layer for (pool, layer) in self._index if pool == name)

    def copy_states(self, src_slot: int, dst_slot: int) -> None:
        """Copy every layer's state of one slot into another (a snapshot taken or restored)."""
        for tensor in self.states.values():
            tensor[dst_slot].copy_(tensor[src_slot])

    def __repr__(self) -> str:
        shapes = {name: list(t.shape) for name, t in self.tensors.items()}
        return f"PagedPools({self.layout.architecture}, {shapes}, dtype={self.dtype})"
