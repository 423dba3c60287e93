"""Bad input to a stage forward is refused with a clear error before any compute, so the
cache is left as it was."""

from __future__ import annotations

import pytest
import torch

from wavepp.models import (
    ChunkSpec,
    LinearBlockAllocator,
    LocalPipeline,
    PagedPools,
    StageBatch,
    StageSpec,
    load_stage_model,
)


@pytest.fixture(scope="module")
def stage_pair(tiny_models):
    """The llama split in two: (first, last) stage models and their caches (8 blocks of 4)."""
    path = tiny_models["llama"]
    first = load_stage_model(path, StageSpec(0, 2, 4), torch.float32)
    last = load_stage_model(path, StageSpec(2, 4, 4), torch.float32)
    return first, last, first.new_kv_cache(8, 4), last.new_kv_cache(8, 4)


def _batch(num_tokens=5, num_cached=0, table=(0, 1)):
    return StageBatch.build([ChunkSpec(num_cached, num_tokens, table, "r")], block_size=4)


@pytest.mark.parametrize("bad_id, index", [(256, 2), (-1, 4), (10_000, 0)])
def test_token_outside_vocabulary(stage_pair, bad_id, index):
    first, _, cache, _ = stage_pair
    before = cache.tensors["key"].clone()
    input_ids = torch.tensor([1, 2, 3, 4, 5])
    input_ids[index] = bad_id
    with pytest.raises(
        ValueError,
        match=rf"token id {bad_id} at batch position {index} is outside "
        r"the vocabulary \[0, 256\)",
    ):
        first(_batch(), cache, input_ids=input_ids)
    assert torch.equal(cache.tensors["key"], before)


def test_input_ids_wrong_count_or_dtype(stage_pair):
    first, _, cache, _ = stage_pair
    with pytest.raises(ValueError, match=r"input_ids must be int64 \[5\]"):
        first(_batch(), cache, input_ids=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"input_ids must be int64 \[5\]"):
        first(_batch(), cache, input_ids=torch.tensor([1.0, 2, 3, 4, 5]))
    with pytest.raises(ValueError, match="the first stage needs input_ids"):
        first(_batch(), cache)


def test_later_stage_needs_hidden_states(stage_pair):
    _, last, _, cache = stage_pair
    with pytest.raises(ValueError, match="pass hidden_states, not input_ids"):
        last(_batch(), cache, input_ids=torch.tensor([1, 2, 3, 4, 5]))
    with pytest.raises(ValueError, match=r"expected \[5, 64\] torch.float32"):
        last(_batch(), cache, hidden_states=torch.zeros(4, 64))


def test_block_outside_cache_and_wrong_cache(stage_pair):
    first, _, cache, last_cache = stage_pair
    ids = torch.tensor([1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="block id 8 is outside the cache's 8 blocks"):
        first(_batch(table=(0, 8)), cache, input_ids=ids)
    with pytest.raises(ValueError, match="batch block_size 4 != cache block_size 16"):
        first(_batch(), first.new_kv_cache(2, 16), input_ids=ids)
    with pytest.raises(ValueError, match="this stage needs"):
        first(
            _batch(),
            PagedPools(first.layout, StageSpec(0, 3, 4), 8, 4, torch.float32),
            input_ids=ids,
        )


def test_position_beyond_model_limit(tiny_models):
    model = load_stage_model(tiny_models["llama"], dtype=torch.float32)  # 8192 positions
    cache = model.new_kv_cache(num_blocks=3, block_size=4096)
    batch = StageBatch.build([ChunkSpec(8190, 3, (0, 1, 2), "r")], block_size=4096)
    with pytest.raises(
        ValueError, match="position 8192 is beyond the model's max_position_embeddings=8192"
    ):
        model(batch, cache, input_ids=torch.tensor([1, 2, 3]))


def test_block_table_too_short(tiny_models):
    with pytest.raises(
        ValueError, match=r"request 'r'\) has 1 blocks of 4 tokens; positions \[0, 7\) need 2"
    ):
        _batch(num_tokens=4, num_cached=3, table=(0,))


def test_empty_prompt_and_chunk(tiny_models):
    pipe = LocalPipeline(tiny_models["qwen2"], dtype=torch.float32, num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match="prompt of request 'r' is empty"):
        pipe.prefill("r", [])
    with pytest.raises(ValueError, match="chunk of request 'r' is empty"):
        pipe.prefill_chunks([("r", [])])
    with pytest.raises(ValueError, match="must be positive and sum to the 3 tokens"):
        pipe.prefill("r", [1, 2, 3], chunk_sizes=[1, 1])
    with pytest.raises(ValueError, match="at most one chunk per request"):
        pipe.prefill_chunks([("r", [1]), ("r", [2])])


def test_slice_outside_model(tiny_models):
    with pytest.raises(
        ValueError, match=r"stage layer range \[2, 6\) is outside the model's 4 layers"
    ):
        load_stage_model(tiny_models["llama"], StageSpec(2, 6, 4))
    with pytest.raises(ValueError, match="cannot split 4 layers into 5 stages"):
        LocalPipeline(tiny_models["llama"], num_stages=5)


def test_out_of_blocks_and_release():
    allocator = LinearBlockAllocator(4)
    assert allocator.allocate(3) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="out of KV cache blocks: 2 needed, 1 free of 4"):
        allocator.allocate(2)
    allocator.free([1])
    allocator.check_integrity()
    assert allocator.allocate(2) == [1, 3]


def test_pipeline_release_frees_blocks(tiny_models):
    pipe = LocalPipeline(tiny_models["llama"], dtype=torch.float32, num_blocks=4, block_size=4)
    pipe.prefill("a", list(range(9)))
    assert pipe.block_table("a") == [0, 1, 2] and pipe.allocator.num_free_blocks == 1
    with pytest.raises(RuntimeError, match="out of KV cache blocks"):
        pipe.prefill("b", list(range(5)))
    pipe.release("a")
    pipe.allocator.check_integrity()
    assert pipe.allocator.num_free_blocks == 4 - len(pipe.block_table("b"))
