"""A hybrid stage's snapshot slots take their bytes from the stage's cache memory: the block
pool is what remains."""

import pytest

from wavepp.sim import SimSetup, get_hardware, get_model
from wavepp.sim.cost.stages import partition_layers, stage_kv_tokens
from wavepp.sim.harness import hybrid_num_slots, hybrid_pool_blocks
from wavepp.sim.studies.scenario import build_system
from wavepp.sim.studies.stage_memory import model_interval_blocks


@pytest.mark.parametrize(
    "blocks, block_mb, snapshot_mb, interval",
    [(3556, 9.4, 26.0, 4), (1000, 1.0, 0.0, 4), (5000, 2.0, 64.0, 16), (40, 1.0, 1.0, 1)],
)
def test_blocks_and_slots_fill_the_memory_of_the_blocks_alone(
    blocks, block_mb, snapshot_mb, interval
):
    n = hybrid_pool_blocks(blocks, block_mb, snapshot_mb, interval)
    used = n * block_mb + (hybrid_num_slots(n, interval) * snapshot_mb if snapshot_mb else 0)
    assert used <= blocks * block_mb + 1e-9
    if snapshot_mb:  # one block more would not fit: nothing left unused but a block's worth
        assert (n + 1) * block_mb + hybrid_num_slots(
            n + 1, interval
        ) * snapshot_mb > blocks * block_mb
        assert n < blocks
    else:
        assert n == blocks


def test_a_memory_without_room_for_the_slots_is_refused():
    with pytest.raises(ValueError, match="does not hold 17 snapshot slots"):
        hybrid_pool_blocks(10, 1.0, 5.0, 4)


def test_kimi_k3_stages_keep_blocks_and_slots_within_their_memory():
    setup = SimSetup(
        get_model("kimi-k3"), get_hardware("GB300"), 8, token_scale=256, snapshot_interval_blocks=4
    )
    m, bs, s = setup.model, setup.block_size, setup.token_scale
    sim = build_system("wavepp", setup)
    bounds = partition_layers(m, setup.hardware, 8)
    for i, ((a, b), server) in enumerate(zip(bounds, sim.servers)):
        pool = server.pool
        memory_blocks = stage_kv_tokens(m, setup.hardware, a, b, first=i == 0, last=i == 7) // (
            bs * s
        )
        block_bytes = sum(m.kv_bytes_per_token(j) for j in range(a, b)) * bs * s
        snapshot_bytes = sum(m.snapshot_bytes(j) for j in range(a, b))
        assert pool.num_slots == hybrid_num_slots(pool.num_blocks, model_interval_blocks(setup))
        assert (
            pool.num_blocks * block_bytes + pool.num_slots * snapshot_bytes
            <= memory_blocks * block_bytes
        )
        assert pool.num_blocks < memory_blocks
