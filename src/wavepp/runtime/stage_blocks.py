"""How many blocks each stage's pool holds: one count for every stage, so that no stage runs
out of blocks before the others.

A request takes its blocks on every stage, and a prefix is reusable only where every stage
holds it, so blocks a stage has beyond the smallest stage's count are never of use to the
leader: that stage would only evict later what the others have already evicted. Stages differ
in what a block costs them (their layer counts differ under `layer_split`; a hybrid model's
linear-attention layers keep state snapshots, not rows; DSA layers add index keys), so the
stages get the same count N, the largest whose blocks and snapshot slots fit every stage's
budget:

    for every stage s:   N * block_bytes(s) + slots(N) * snapshot_bytes(s) <= budget(s)
    slots(N) = N // interval + MIN_SNAPSHOT_SLOTS                    (models/stage_pool.py)

    budget(s)   kv_cache_gib if given; else min(DEFAULT_KV_MAX_BYTES, a quarter of the
                available memory over the stages), and N at most DEFAULT_KV_FULL_PROMPTS
                prompts of the model's full length

`stage_num_blocks` given to the engine is taken as it is (stages may then differ on purpose).
The counts are computed once, on rank 0, and carried to every rank in its RuntimeConfig.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from wavepp.engine_config import EngineConfig
from wavepp.models import page_layout, stage_specs
from wavepp.models.stage_pool import MIN_SNAPSHOT_SLOTS, model_interval_blocks
from wavepp.runtime.device import TORCH_DTYPES

DEFAULT_KV_FULL_PROMPTS = 32
DEFAULT_KV_MAX_BYTES = 2**30
# a pool none of whose stages' layers cost bytes per block (never a real model): its blocks
# are bookkeeping only
UNBOUNDED_BLOCKS = 1 << 12


def available_memory_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 8 * 2**30


def blocks_within(budget: int, block_bytes: int, snapshot_bytes: int, interval: int) -> int | None:
    """The most blocks N with N * block_bytes + (N // interval + MIN_SNAPSHOT_SLOTS) *
    snapshot_bytes <= budget (at least 1); None when blocks cost this stage nothing."""

    def cost(n: int) -> int:
        return n * block_bytes + (n // interval + MIN_SNAPSHOT_SLOTS) * snapshot_bytes

    if block_bytes == 0 and snapshot_bytes == 0:
        return None
    # cost(n) >= n * (block_bytes + snapshot_bytes / interval) - snapshot_bytes: an upper bound
    per_block = block_bytes + snapshot_bytes / interval
    lo, hi = 0, int((budget + snapshot_bytes) / per_block) + 1
    while lo < hi:  # the largest n in [0, hi] with cost(n) <= budget
        mid = (lo + hi + 1) // 2
        if cost(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return max(1, lo)


def stage_blocks(
    engine: EngineConfig, model_config, layer_split: Sequence[int] = ()
) -> tuple[int, ...]:
    """Every stage's block count for `engine`'s options on `model_config`, its layers split
    as `layer_split` says (empty: evenly): the given `stage_num_blocks`, else one count for all
    stages (see the module's table)."""
    if engine.stage_num_blocks:
        return tuple(engine.stage_num_blocks)
    layout = page_layout(model_config)
    dtype_bytes = TORCH_DTYPES[engine.dtype].itemsize
    num_layers = model_config.num_layers
    interval = engine.snapshot_interval_blocks or model_interval_blocks(
        layout, num_layers, engine.block_size, dtype_bytes
    )
    if engine.kv_cache_gib is not None:
        budget = int(engine.kv_cache_gib * 2**30)
        cap = None
    else:
        budget = min(DEFAULT_KV_MAX_BYTES, available_memory_bytes() // (4 * engine.pp))
        cap = DEFAULT_KV_FULL_PROMPTS * -(
            -model_config.max_position_embeddings // engine.block_size
        )
    counts = []
    for spec in stage_specs(num_layers, engine.pp, layer_split):
        block_bytes = layout.bytes_per_block(
            spec.start_layer, spec.end_layer, engine.block_size, dtype_bytes
        )
        snapshot_bytes = layout.bytes_per_snapshot(spec.start_layer, spec.end_layer, dtype_bytes)
        n = blocks_within(budget, block_bytes, snapshot_bytes, interval)
        if n is not None:
            counts.append(n)
    n = min(counts) if counts else UNBOUNDED_BLOCKS
    if cap is not None:
        n = min(n, cap)
    return (n,) * engine.pp
