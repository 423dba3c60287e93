"""ModelConfig parsing, stage specs and splits, and the exact index tensors of a StageBatch."""

from __future__ import annotations

import json

import pytest
import torch

from wavepp.models import (
    SUPPORTED_ARCHITECTURES,
    ChunkSpec,
    Llama3RopeScaling,
    PagedPools,
    StageBatch,
    StageSpec,
    load_model_config,
    page_layout,
    split_layers,
    stage_specs,
)
from wavepp.models.families.llama import LlamaConfig as ModelConfig

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512,
}


def test_parses_each_architecture(tiny_models):
    llama, qwen2, qwen3 = (load_model_config(tiny_models[a]) for a in ("llama", "qwen2", "qwen3"))
    assert (
        llama.architecture,
        llama.num_layers,
        llama.num_heads,
        llama.num_kv_heads,
        llama.head_dim,
    ) == ("LlamaForCausalLM", 4, 4, 2, 16)
    assert (llama.qkv_bias, llama.o_bias, llama.qk_norm) == (False, False, False)
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm) == (True, False, False)
    assert (qwen3.qkv_bias, qwen3.o_bias, qwen3.qk_norm) == (False, False, True)
    assert llama.rope_theta == 10000.0 and llama.rope_scaling is None


def test_rope_theta_old_and_new_style():
    old = ModelConfig.from_hf({**LLAMA, "rope_theta": 500000.0})
    new = ModelConfig.from_hf(
        {**LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": 250000.0}}
    )
    assert (old.rope_theta, new.rope_theta) == (500000.0, 250000.0)
    scaled = ModelConfig.from_hf(
        {
            **LLAMA,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        }
    )
    assert scaled.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 8192)
    assert scaled.rope_theta == 500000.0


def test_model_type_decides_when_architectures_is_null():
    config = ModelConfig.from_hf({**LLAMA, "architectures": None, "model_type": "qwen3"})
    assert config.architecture == "Qwen3ForCausalLM" and config.qk_norm


def test_llama_attention_bias_covers_output_projection():
    config = ModelConfig.from_hf({**LLAMA, "attention_bias": True})
    assert config.qkv_bias and config.o_bias


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"architectures": ["MistralForCausalLM"]},
            "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM",
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
            "rope_type 'yarn'",
        ),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"num_key_value_heads": 3}, "num_kv_heads=3"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_unsupported_configs_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf({**LLAMA, **change})


def test_unsupported_architecture_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({**LLAMA, "architectures": ["GPT2LMHeadModel"]})
    )
    with pytest.raises(ValueError) as err:
        load_model_config(tmp_path)
    assert "GPT2LMHeadModel" in str(err.value)
    assert all(name in str(err.value) for name in SUPPORTED_ARCHITECTURES)


def test_split_layers_balanced_and_contiguous():
    assert split_layers(30, 4) == [(0, 8), (8, 16), (16, 23), (23, 30)]
    assert split_layers(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split_layers(5, 1) == [(0, 5)]
    specs = stage_specs(7, 3)
    assert [(s.is_first, s.is_last) for s in specs] == [
        (True, False),
        (False, False),
        (False, True),
    ]
    with pytest.raises(ValueError, match="cannot split 3 layers into 4 stages"):
        split_layers(3, 4)


def test_split_layers_by_given_sizes():
    assert split_layers(30, 2, [14, 16]) == [(0, 14), (14, 30)]
    assert split_layers(6, 3, (1, 3, 2)) == [(0, 1), (1, 4), (4, 6)]
    assert [(s.start_layer, s.end_layer) for s in stage_specs(30, 2, [14, 16])] == [
        (0, 14),
        (14, 30),
    ]
    for sizes in ([15, 14], [30, 0], [10, 10, 10], [31, -1]):
        with pytest.raises(
            ValueError, match="must give each of the 2 stages at least one layer and sum to"
        ):
            split_layers(30, 2, sizes)


@pytest.mark.parametrize("start, end", [(-1, 2), (2, 2), (3, 5), (0, 31)])
def test_stage_range_outside_model(start, end):
    with pytest.raises(ValueError, match=rf"\[{start}, {end}\) is outside the model's \d+ layers"):
        StageSpec(start, end, 4 if end != 31 else 30)


def test_batch_index_tensors_exact():
    # block size 4. chunk 0: request "a", 5 cached tokens, computes positions 5..8
    #   [0, 4) block 7 (slots 28..31) | [4, 8) block 2 (slots 8..11) | [8, 9) block 4 (slot 16)
    # chunk 1: request "b" computes positions 0..2 in block 6 (slots 24..26)
    batch = StageBatch.build(
        [ChunkSpec(5, 4, (7, 2, 4), "a"), ChunkSpec(0, 3, (6,), "b")], block_size=4
    )
    assert batch.token_starts == (0, 4, 7) and batch.context_starts == (0, 9, 12)
    assert batch.positions.tolist() == [5, 6, 7, 8, 0, 1, 2]
    assert batch.slot_mapping.tolist() == [9, 10, 11, 16, 24, 25, 26]
    assert batch.context_slots.tolist() == [28, 29, 30, 31, 8, 9, 10, 11, 16, 24, 25, 26]
    assert batch.last_token_indices.tolist() == [3, 6]
    assert (batch.num_tokens, batch.num_chunks, batch.max_block_id, batch.max_position) == (
        7,
        2,
        7,
        8,
    )
    assert batch.causal_mask.tolist() == [
        [False, True, True, True],
        [False, False, True, True],
        [False, False, False, True],
        [False, False, False, False],
    ]
    assert batch.causal_bias(torch.float32)[0].tolist() == [
        0.0,
        float("-inf"),
        float("-inf"),
        float("-inf"),
    ]


def test_block_table_too_short_for_chunk():
    with pytest.raises(ValueError, match=r"has 2 blocks of 4 tokens; positions \[0, 9\) need 3"):
        StageBatch.build([ChunkSpec(5, 4, (7, 2), "a")], block_size=4)


def test_empty_chunk_and_empty_batch():
    with pytest.raises(ValueError, match="is empty"):
        ChunkSpec(3, 0, (0,), "a")
    with pytest.raises(ValueError, match="at least one chunk"):
        StageBatch.build([], block_size=4)


def test_overlapping_block_tables_rejected():
    with pytest.raises(ValueError, match="same cache slot"):
        StageBatch.build([ChunkSpec(0, 4, (3,), "a"), ChunkSpec(0, 2, (3,), "b")], block_size=4)


def test_shared_prefix_blocks_are_read_only():
    # a and b share prefix block 5 (read-only); c may not write into it
    shared = [ChunkSpec(4, 2, (5, 1), "a"), ChunkSpec(4, 3, (5, 2), "b")]
    assert StageBatch.build(shared, block_size=4).slot_mapping.tolist() == [4, 5, 8, 9, 10]
    with pytest.raises(ValueError, match="overwrite a \\(shared\\) prefix block"):
        StageBatch.build(shared + [ChunkSpec(0, 2, (5,), "c")], block_size=4)


def test_paged_cache_shape_and_views():
    # layers [2, 4) of a 4-layer Llama with 2 KV heads of 16: key and value pools of 32 a token
    layout = page_layout(ModelConfig.from_hf({**LLAMA, "head_dim": 16}))
    cache = PagedPools(layout, StageSpec(2, 4, 4), num_blocks=8, block_size=4, dtype=torch.float32)
    assert tuple(cache.tensors["key"].shape) == (2, 8, 4, 2 * 16) and cache.num_slots == 32
    key = cache.view("key", 3)  # the stage's second layer
    key[4 * 3 + 1] = 1.0  # block 3, offset 1
    assert cache.tensors["key"][1, 3, 1].eq(1.0).all() and cache.tensors["key"][0].eq(0).all()
    assert cache.view("value", 3).eq(0).all()
    assert cache.num_bytes == 2 * 2 * 8 * 4 * 2 * 16 * 4
    with pytest.raises(ValueError, match="num_blocks >= 1"):
        PagedPools(layout, StageSpec(2, 4, 4), 0, 4)
