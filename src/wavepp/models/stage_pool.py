"""The block pool of one stage, sized from the model's page layout: a `BlockPool`, or for a
hybrid model a `SnapshotPool` whose snapshot slots share the stage's memory budget.

Every stage of a hybrid model keeps the same snapshot grid (the leader resumes a request only
at a boundary every stage holds), chosen once for the whole model by `default_interval_blocks`
from the bytes of a snapshot against the bytes of a block over all layers. A stage's slots:
one per grid point of its blocks, plus room for the working slots of the requests in flight;
a stage with no linear-attention layers keeps zero-byte snapshots (only their bookkeeping).
"""

from __future__ import annotations

from wavepp.cache import BlockPool, SnapshotPool, default_interval_blocks
from wavepp.models.spec import PageLayout, StageSpec

MIN_SNAPSHOT_SLOTS = 64  # working slots of the requests in flight, and end snapshots


def model_interval_blocks(
    layout: PageLayout, num_layers: int, block_size: int, dtype_bytes: int
) -> int:
    """The snapshot grid of the whole model, in blocks."""
    return default_interval_blocks(
        layout.bytes_per_snapshot(0, num_layers, dtype_bytes),
        layout.bytes_per_block(0, num_layers, block_size, dtype_bytes),
    )


def num_snapshot_slots(num_blocks: int, interval_blocks: int) -> int:
    return num_blocks // interval_blocks + MIN_SNAPSHOT_SLOTS


def stage_pool(
    layout: PageLayout,
    num_layers: int,
    stage: StageSpec,
    num_blocks: int,
    block_size: int,
    dtype_bytes: int,
    interval_blocks: int | None = None,
) -> BlockPool:
    """A fresh pool for `stage`: a BlockPool, or a SnapshotPool if the layout keeps snapshots."""
    if not layout.is_hybrid:
        return BlockPool(num_blocks, block_size)
    interval = interval_blocks or model_interval_blocks(layout, num_layers, block_size, dtype_bytes)
    return SnapshotPool(
        num_blocks,
        block_size,
        num_slots=num_snapshot_slots(num_blocks, interval),
        interval_blocks=interval,
        bytes_per_snapshot=layout.bytes_per_snapshot(
            stage.start_layer, stage.end_layer, dtype_bytes
        ),
    )
