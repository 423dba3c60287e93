"""SmolLM2-135M with real weights (the built-in model) against transformers."""

from __future__ import annotations

import pytest
import torch

from tests.models.conftest import hf_logits
from tests.models.test_models_vs_transformers import BF16_ATTENTION
from wavepp.models import ChunkSpec, LocalPipeline, StageBatch
from wavepp.models.kernels import Kernels

PROMPTS = [
    "The capital of France is",
    "import numpy as np\nimport matplotlib.pyplot as",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4, 5,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]


@pytest.fixture(scope="module")
def smollm2():
    try:
        from wavepp.model_store import resolve_model

        path = resolve_model("smollm2")
    except (ImportError, FileNotFoundError) as err:
        pytest.skip(f"built-in SmolLM2 unavailable: {err}")
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return path, [tokenizer(prompt).input_ids for prompt in PROMPTS]


def test_fp32_matches_transformers(smollm2):
    path, prompts = smollm2
    pipe = LocalPipeline(path, dtype=torch.float32, num_stages=3, num_blocks=32, block_size=16)
    for index, ids in enumerate(prompts):
        sizes = [len(ids)] if index % 2 else [len(ids) // 2, len(ids) - len(ids) // 2]
        logprobs = pipe.prefill(index, ids, chunk_sizes=sizes).log_softmax(-1)
        expected = hf_logits(path, ids)[-1].log_softmax(-1)
        assert int(logprobs.argmax()) == int(expected.argmax())
        top = expected.topk(10).indices
        assert (logprobs[top] - expected[top]).abs().max() < 1e-3


@pytest.mark.parametrize("attention", BF16_ATTENTION)
def test_bf16_first_token_matches_fp32_reference(smollm2, attention):
    """Over 30 bf16 layers the top logprobs move by up to ~0.1 (transformers' own bf16 run
    moves them as much); the greedy token must not change on these prompts."""
    path, prompts = smollm2
    pipe = LocalPipeline(
        path,
        dtype=torch.bfloat16,
        num_blocks=32,
        block_size=16,
        kernels=Kernels(attention=attention),
    )
    for index, ids in enumerate(prompts):
        logprobs = pipe.prefill(index, ids, chunk_sizes=[3, len(ids) - 3]).log_softmax(-1)
        expected = hf_logits(path, ids)[-1].log_softmax(-1)
        assert int(logprobs.argmax()) == int(expected.argmax())
        greedy = int(expected.argmax())
        assert abs(float(logprobs[greedy] - expected[greedy])) < 0.15


@pytest.mark.parametrize("attention", BF16_ATTENTION)
def test_bf16_long_shared_prompts_match_fp32_reference(smollm2, attention):
    """Two 600-token prompts that share their first 512 tokens, cached once (in chunks of 256),
    then both tails in one wave whose block tables start with the same blocks (the kernels'
    shared-prefix path, many online-softmax steps): each greedy token is the fp32 reference's,
    its logprob within 0.15."""
    path, prompts = smollm2
    base = [token for ids in prompts for token in ids] * 14
    prefix, tails = base[:512], (base[512:600], base[700:788])
    pipe = LocalPipeline(
        path,
        dtype=torch.bfloat16,
        num_blocks=128,
        block_size=16,
        kernels=Kernels(attention=attention),
    )
    pipe.prefill("prefix", prefix, chunk_sizes=[256, 256])
    shared = pipe.block_table("prefix")
    chunks = [
        ChunkSpec(512, len(tail), tuple(shared + pipe.allocator.allocate(6)), i)
        for i, tail in enumerate(tails)
    ]
    logits = pipe.run(StageBatch.build(chunks, 16), torch.tensor(tails[0] + tails[1]))
    for row, tail in zip(logits, tails):
        logprobs = row.float().log_softmax(-1)
        expected = hf_logits(path, prefix + tail)[-1].log_softmax(-1)
        greedy = int(expected.argmax())
        assert int(logprobs.argmax()) == greedy
        assert abs(float(logprobs[greedy] - expected[greedy])) < 0.15
