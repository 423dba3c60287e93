"""What one cached token costs, per layer and per pool: the page layout of a model.

A block of B tokens is one unit for the block pool (cached, leased, escrowed and evicted as a
whole), but its bytes live in several tensors, one per *pool*, each [layers, blocks, B, width].
Each layer kind declares its pools (`spec/attention.py`); the layout gathers them:

    layers             pools (width in elements per token and layer)
    gqa                key: kv_heads * head_dim | value: kv_heads * head_dim
    mla                latent: kv_lora_rank + qk_rope_head_dim   (compressed latent | RoPE key)
    mla with DSA       latent | index_key: index_head_dim, on layers running their own indexer
    kda (hybrid)       no per-token rows; per snapshot: recurrent: heads * dk * dv (fp32) |
                       conv: (conv_kernel - 1) * 3 * heads * head_dim (model dtype)

A hybrid model's linear-attention layers keep one state per sequence, and a prefix can be
resumed only where that state was saved, a *snapshot* taken at a block boundary. A snapshot is
an attachment of its block with its own bytes (`bytes_per_snapshot`), in the same budget.

Block ids are shared by all pools: block b of every pool belongs to the same tokens. The
runtime sizes its pools from a memory budget (runtime/stage_blocks.py); the simulator reads
the same layout. Pure Python (no torch), so both sides import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CachePool:
    """`width` elements per token on each of `layers` (model layer indices)."""

    name: str
    width: int
    layers: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.width <= 0 or not self.layers:
            raise ValueError(f"pool {self.name!r} needs width > 0 and at least one layer")


@dataclass(frozen=True)
class StatePool:
    """`elements` per snapshot on each of `layers`; fp32 whatever the model dtype, or not."""

    name: str
    elements: int
    layers: tuple[int, ...]
    fp32: bool = False

    def element_bytes(self, dtype_bytes: int) -> int:
        return 4 if self.fp32 else dtype_bytes


@dataclass(frozen=True)
class PageLayout:
    architecture: str
    pools: tuple[CachePool, ...]
    states: tuple[StatePool, ...] = ()

    @property
    def is_hybrid(self) -> bool:
        return bool(self.states)

    def bytes_per_snapshot(self, start_layer: int, end_layer: int, dtype_bytes: int) -> int:
        """Bytes of one state snapshot over the layers [start_layer, end_layer) of a stage."""
        return sum(
            s.elements * s.element_bytes(dtype_bytes)
            for s in self.states
            for i in s.layers
            if start_layer <= i < end_layer
        )

    def pool(self, name: str) -> CachePool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"{self.architecture} has no cache pool {name!r}")

    def elements_per_token(self, layer: int) -> int:
        """Cache elements one token adds to `layer`, summed over pools."""
        return sum(p.width for p in self.pools if layer in p.layers)

    def bytes_per_token(self, layer: int, dtype_bytes: int) -> int:
        return self.elements_per_token(layer) * dtype_bytes

    def bytes_per_block(
        self, start_layer: int, end_layer: int, block_size: int, dtype_bytes: int
    ) -> int:
        """Bytes of one block over the layers [start_layer, end_layer) of a stage."""
        return block_size * sum(
            self.bytes_per_token(i, dtype_bytes) for i in range(start_layer, end_layer)
        )


def page_layout(spec) -> PageLayout:
    """The layout of a ModelSpec: each layer's declared pools, gathered by (name, width) in
    the order the layers first declare them."""
    pools: dict[tuple[str, int], list[int]] = {}
    states: dict[tuple[str, int, bool], list[int]] = {}
    for index, layer in enumerate(spec.layers):
        for name, width in layer.attention.cache_pools():
            pools.setdefault((name, width), []).append(index)
        for name, elements, fp32 in layer.attention.state_pools():
            states.setdefault((name, elements, fp32), []).append(index)
    return PageLayout(
        spec.architecture,
        tuple(CachePool(name, width, tuple(layers)) for (name, width), layers in pools.items()),
        tuple(
            StatePool(name, elements, tuple(layers), fp32)
            for (name, elements, fp32), layers in states.items()
        ),
    )
