"""Stage models against transformers' own model code, on tiny random Llama / Qwen2 / Qwen3.

fp32: logits within 1e-4 of transformers at every chunk's last token, however the prompt is
chunked, paged or split into stages. bf16: compared with the fp32 reference (the quantity
that matters); see test_bf16_close_to_fp32_reference for the tolerance.
"""

from __future__ import annotations

import pytest
import torch

from tests.models.conftest import ARCHS, hf_logits, random_prompt
from wavepp.models import ChunkSpec, LocalPipeline, StageBatch, load_stage_model
from wavepp.models.kernels import Kernels, cpp

# bf16 runs with the default kernel and with the AMX one where this CPU has it
BF16_ATTENTION = [
    "chunked",
    pytest.param(
        "amx",
        marks=pytest.mark.skipif(
            cpp.amx_attention_kernels() is None,
            reason="no AMX-BF16 on this CPU: the AMX attention kernel does not run",
        ),
    ),
]

FP32_ATOL = 1e-4


def _chunk_ends(chunk_sizes: list[int]) -> list[int]:
    ends, total = [], 0
    for size in chunk_sizes:
        total += size
        ends.append(total)
    return ends


@pytest.mark.parametrize("arch", ARCHS)
def test_full_prompt_matches_transformers(tiny_models, arch):
    prompt = random_prompt(40, seed=1)
    pipe = LocalPipeline(tiny_models[arch], dtype=torch.float32, num_blocks=16, block_size=16)
    logits = pipe.prefill("r", prompt)
    torch.testing.assert_close(
        logits, hf_logits(tiny_models[arch], prompt)[-1], atol=FP32_ATOL, rtol=0
    )


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize(
    "chunk_sizes", [[1, 45], [5, 7, 13, 21], [16, 16, 14], [3] * 15 + [1], [33, 1, 12]]
)
def test_chunks_over_cached_prefix_match_transformers(tiny_models, arch, block_size, chunk_sizes):
    prompt = random_prompt(46, seed=2)
    reference = hf_logits(tiny_models[arch], prompt)
    pipe = LocalPipeline(
        tiny_models[arch], dtype=torch.float32, num_blocks=16, block_size=block_size
    )
    start = 0
    for _size, end in zip(chunk_sizes, _chunk_ends(chunk_sizes)):
        assert pipe.num_cached_tokens("r") == start
        logits = pipe.prefill_chunks([("r", prompt[start:end])])[0]
        torch.testing.assert_close(logits, reference[end - 1], atol=FP32_ATOL, rtol=0)
        start = end


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
def test_stage_slices_chained_match_transformers(tiny_models, arch, num_stages):
    prompt = random_prompt(30, seed=3)
    pipe = LocalPipeline(
        tiny_models[arch], dtype=torch.float32, num_stages=num_stages, num_blocks=16, block_size=4
    )
    assert len(pipe.stages) == num_stages
    logits = pipe.prefill("r", prompt, chunk_sizes=[11, 6, 13])
    torch.testing.assert_close(
        logits, hf_logits(tiny_models[arch], prompt)[-1], atol=FP32_ATOL, rtol=0
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_batch_equals_each_request_alone(tiny_models, arch):
    """One forward over chunks with cached prefixes of 20, 7 and 0 tokens."""
    prompts = {
        "a": random_prompt(33, seed=4),
        "b": random_prompt(37, seed=5),
        "c": random_prompt(9, seed=6),
    }
    cached = {"a": 20, "b": 7, "c": 0}
    batched = LocalPipeline(
        tiny_models[arch], dtype=torch.float32, num_stages=2, num_blocks=32, block_size=4
    )
    for request_id in ("a", "b"):
        batched.prefill(request_id, prompts[request_id][: cached[request_id]])
    logits = batched.prefill_chunks([(r, prompts[r][cached[r] :]) for r in ("a", "b", "c")])
    # the three block tables interleave in the shared pool: a (5 blocks), b (2), then growth
    assert batched.block_table("a")[:5] == [0, 1, 2, 3, 4]
    for row, request_id in enumerate(("a", "b", "c")):
        alone = LocalPipeline(
            tiny_models[arch], dtype=torch.float32, num_stages=1, num_blocks=16, block_size=4
        )
        expected = alone.prefill(request_id, prompts[request_id])
        torch.testing.assert_close(logits[row], expected, atol=1e-5, rtol=0)
        reference = hf_logits(tiny_models[arch], prompts[request_id])[-1]
        torch.testing.assert_close(logits[row], reference, atol=FP32_ATOL, rtol=0)


def test_scattered_block_table_and_shared_cache(tiny_models):
    """Blocks out of order, two requests in one cache, StageModel driven directly."""
    path = tiny_models["llama"]
    model = load_stage_model(path, dtype=torch.float32)
    cache = model.new_kv_cache(num_blocks=12, block_size=4)
    first, second = random_prompt(14, seed=7), random_prompt(10, seed=8)
    tables = {"x": (9, 2, 11, 0), "y": (5, 3, 7)}
    # wave 1: x[0:6] and y[0:10];  wave 2: x[6:14] after its 6 cached tokens
    wave1 = StageBatch.build(
        [ChunkSpec(0, 6, tables["x"][:2], "x"), ChunkSpec(0, 10, tables["y"], "y")], 4
    )
    logits1 = model(wave1, cache, input_ids=torch.tensor(first[:6] + second))
    wave2 = StageBatch.build([ChunkSpec(6, 8, tables["x"], "x")], 4)
    logits2 = model(wave2, cache, input_ids=torch.tensor(first[6:]))
    torch.testing.assert_close(logits1[0], hf_logits(path, first)[5], atol=FP32_ATOL, rtol=0)
    torch.testing.assert_close(logits1[1], hf_logits(path, second)[-1], atol=FP32_ATOL, rtol=0)
    torch.testing.assert_close(logits2[0], hf_logits(path, first)[-1], atol=FP32_ATOL, rtol=0)


def test_tied_embeddings_and_grouped_heads(tied_model):
    prompt = random_prompt(25, seed=9)
    pipe = LocalPipeline(tied_model, dtype=torch.float32, num_stages=3, num_blocks=16, block_size=4)
    assert pipe.stages[0].embed is not None and pipe.stages[2].lm_head is not None
    logits = pipe.prefill("r", prompt, chunk_sizes=[10, 15])
    torch.testing.assert_close(logits, hf_logits(tied_model, prompt)[-1], atol=FP32_ATOL, rtol=0)


def test_llama3_rope_scaling(llama3_model):
    prompt = random_prompt(120, seed=10)
    pipe = LocalPipeline(llama3_model, dtype=torch.float32, num_blocks=16, block_size=16)
    logits = pipe.prefill("r", prompt, chunk_sizes=[70, 50])
    torch.testing.assert_close(logits, hf_logits(llama3_model, prompt)[-1], atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("attention", BF16_ATTENTION)
@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_close_to_fp32_reference(tiny_models, arch, attention):
    """bf16 keeps 8 mantissa bits, so logprobs move by a few hundredths over 4 layers:
    transformers' own bf16 run differs from its fp32 run by up to 0.055 on these models. We
    require the top-5 logprobs within 0.1 of the fp32 reference, and the greedy token to be
    the reference's, or (when the reference's top two are within 0.2) nearly as likely."""
    prompt = random_prompt(60, seed=11)
    reference = hf_logits(tiny_models[arch], prompt).log_softmax(-1)
    pipe = LocalPipeline(
        tiny_models[arch],
        dtype=torch.bfloat16,
        num_blocks=32,
        block_size=4,
        kernels=Kernels(attention=attention),
    )
    for start, end in ((0, 20), (20, 45), (45, 60)):
        logprobs = pipe.prefill_chunks([("r", prompt[start:end])])[0].log_softmax(-1)
        expected = reference[end - 1]
        top = expected.topk(5).indices
        assert (logprobs[top] - expected[top]).abs().max() < 0.1
        best, runner_up = expected.topk(2).values
        chosen = int(logprobs.argmax())
        if best - runner_up > 0.2:
            assert chosen == int(expected.argmax())
        else:
            assert expected[chosen] > best - 0.1


@pytest.mark.parametrize("max_tile_rows", [16, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_chunks_in_several_score_tiles(tiny_models, monkeypatch, max_tile_rows, dtype):
    """Chunks longer than one score tile: every tile but the last sees a shorter context."""
    import wavepp.models.kernels.attention as attention

    monkeypatch.setattr(attention, "_MAX_TILE_ROWS", max_tile_rows)
    prompt = random_prompt(400, seed=13)
    reference = hf_logits(tiny_models["qwen3"], prompt).log_softmax(-1)
    pipe = LocalPipeline(tiny_models["qwen3"], dtype=dtype, num_blocks=32, block_size=16)
    for start, end in ((0, 150), (150, 400)):
        logprobs = pipe.prefill_chunks([("r", prompt[start:end])])[0].log_softmax(-1)
        if dtype == torch.float32:
            torch.testing.assert_close(logprobs, reference[end - 1], atol=FP32_ATOL, rtol=0)
        else:  # tolerance as in test_bf16_close_to_fp32_reference
            top = reference[end - 1].topk(5).indices
            assert (logprobs[top] - reference[end - 1][top]).abs().max() < 0.1
