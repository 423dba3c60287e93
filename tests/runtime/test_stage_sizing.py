"""The default cache of a stage is sized from the model and the machine, not a fixed 1 GiB;
every stage gets the same block count, the most that fits the costliest stage."""

import pytest

from wavepp.engine_config import EngineConfig
from wavepp.models import load_model_config, page_layout, stage_specs
from wavepp.models.stage_pool import MIN_SNAPSHOT_SLOTS, model_interval_blocks
from wavepp.random_checkpoint import make_model
from wavepp.runtime import stage_blocks as sizing
from wavepp.runtime.stage_blocks import (
    DEFAULT_KV_FULL_PROMPTS,
    DEFAULT_KV_MAX_BYTES,
    blocks_within,
    stage_blocks,
)


def test_default_pool_holds_full_length_prompts_within_the_caps(tiny, monkeypatch):
    model = load_model_config(tiny)  # 4 layers, 2 kv heads, head_dim 16, 512 positions
    engine = EngineConfig(pp=2, dtype="float32", block_size=16)
    bytes_per_token = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers a stage, 2 kv heads, head_dim 16, fp32
    monkeypatch.setattr(sizing, "available_memory_bytes", lambda: 64 * 2**30)
    expected = DEFAULT_KV_FULL_PROMPTS * model.max_position_embeddings // 16
    assert stage_blocks(engine, model) == (expected, expected) == (1024, 1024)
    # a machine with little memory left: a quarter of it, shared by the stages
    monkeypatch.setattr(sizing, "available_memory_bytes", lambda: 8 * 2**20)
    assert stage_blocks(engine, model)[0] == (8 * 2**20 // 8) // (bytes_per_token * 16)
    # given sizes win
    assert stage_blocks(EngineConfig(pp=2, kv_cache_gib=0.001), model)[1] == int(0.001 * 2**30) // (
        bytes_per_token // 2 * 16
    )  # bf16 by default
    assert stage_blocks(EngineConfig(pp=2, stage_num_blocks=(7, 9)), model) == (7, 9)
    assert DEFAULT_KV_MAX_BYTES == 2**30


def test_an_uneven_split_gives_every_stage_the_costliest_stages_count(tiny):
    """3 layers on stage 0 and 1 on stage 1: a block costs stage 0 three times as much, so
    both stages hold what stage 0's budget holds (stage 1's surplus could never be reused)."""
    model = load_model_config(tiny)
    engine = EngineConfig(pp=2, dtype="float32", block_size=16, kv_cache_gib=0.001)
    block_bytes = 16 * 2 * 2 * 16 * 4  # per layer: 16 tokens, K and V, 2 heads, head_dim 16
    assert stage_blocks(engine, model, (3, 1)) == (int(0.001 * 2**30) // (3 * block_bytes),) * 2
    assert stage_blocks(engine, model, (1, 3)) == stage_blocks(engine, model, (3, 1))


@pytest.mark.parametrize(
    "block_bytes, snapshot_bytes, interval", [(7, 0, 1), (5, 40, 4), (0, 9, 2)]
)
def test_blocks_within_is_the_most_that_fits(block_bytes, snapshot_bytes, interval):
    def cost(n):
        return n * block_bytes + (n // interval + MIN_SNAPSHOT_SLOTS) * snapshot_bytes

    for budget in range(0, 3000, 37):
        most = max((n for n in range(0, 3000) if cost(n) <= budget), default=0)
        assert blocks_within(budget, block_bytes, snapshot_bytes, interval) == max(most, 1)
    assert blocks_within(100, 0, 0, 1) is None


@pytest.mark.parametrize("pp, split", [(2, ()), (3, ()), (3, (12, 8, 7))])
def test_a_hybrid_models_stages_all_fit_their_budget_with_one_count(tmp_path, pp, split):
    """Kimi-Linear's layer pattern (KDA layers keep snapshots, MLA layers keep rows): stages
    differ in what a block and a snapshot cost them, yet every stage gets the same count, all
    of its blocks and snapshot slots fit its budget, and one block more would not fit some
    stage's."""
    full = (3, 7, 11, 15, 19, 23, 26)
    types = tuple("full_attention" if i in full else "linear_attention" for i in range(27))
    path = make_model(tmp_path / "kimi", arch="kimi_linear", num_layers=27, layer_types=types)
    model = load_model_config(path)
    budget_gib = 0.02  # a 64-slot floor of snapshots alone is 2-4 MiB a stage
    engine = EngineConfig(pp=pp, dtype="float32", block_size=16, kv_cache_gib=budget_gib)
    counts = stage_blocks(engine, model, split)
    assert len(set(counts)) == 1 and counts[0] > 1
    layout, budget = page_layout(model), int(budget_gib * 2**30)
    interval = model_interval_blocks(layout, 27, 16, 4)

    def cost(spec, n):
        block = layout.bytes_per_block(spec.start_layer, spec.end_layer, 16, 4)
        snapshot = layout.bytes_per_snapshot(spec.start_layer, spec.end_layer, 4)
        return n * block + (n // interval + MIN_SNAPSHOT_SLOTS) * snapshot

    specs = stage_specs(27, pp, split)
    assert all(cost(spec, counts[0]) <= budget for spec in specs)
    assert any(cost(spec, counts[0] + 1) > budget for spec in specs)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("kv_cache_gib", 0.0, "kv_cache_gib must be positive"),
        ("num_threads", 0, "num_threads must be >= 1"),
        ("backend", "mpi", "backend must be 'gloo' or 'nccl'"),
        ("policy", "vllm-pp", "unknown policy 'vllm-pp'"),
        ("pp", True, "must be a positive integer"),
    ],
)
def test_engine_config_names_the_bad_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{"pp": 2, field: value})
