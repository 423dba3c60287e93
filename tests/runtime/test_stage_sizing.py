"""The default cache of a stage is sized from the model and the machine, not a fixed 1 GiB."""

import pytest

from wavepp.engine_config import EngineConfig
from wavepp.models import load_model_config
from wavepp.runtime import stage as stage_mod
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.stage import DEFAULT_KV_FULL_PROMPTS, DEFAULT_KV_MAX_BYTES, stage_num_blocks


def test_default_pool_holds_full_length_prompts_within_the_caps(tiny, monkeypatch):
    model = load_model_config(tiny)  # 4 layers, 2 kv heads, head_dim 16, 512 positions
    config = RuntimeConfig(EngineConfig(pp=2, dtype="float32", block_size=16), str(tiny))
    bytes_per_token = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers a stage, 2 kv heads, head_dim 16, fp32
    monkeypatch.setattr(stage_mod, "available_memory_bytes", lambda: 64 * 2**30)
    expected = DEFAULT_KV_FULL_PROMPTS * model.max_position_embeddings // 16
    assert stage_num_blocks(config, model, 0) == expected == 1024
    # a machine with little memory left: a quarter of it, shared by the stages
    monkeypatch.setattr(stage_mod, "available_memory_bytes", lambda: 8 * 2**20)
    assert stage_num_blocks(config, model, 0) == (8 * 2**20 // 8) // (bytes_per_token * 16)
    # given sizes win
    assert stage_num_blocks(
        RuntimeConfig(EngineConfig(pp=2, kv_cache_gib=0.001), ""), model, 1
    ) == int(0.001 * 2**30) // (bytes_per_token // 2 * 16)  # bf16 by default
    assert (
        stage_num_blocks(RuntimeConfig(EngineConfig(pp=2, stage_num_blocks=(7, 9)), ""), model, 1)
        == 9
    )
    assert DEFAULT_KV_MAX_BYTES == 2**30


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
