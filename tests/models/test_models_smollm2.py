"""SmolLM2-135M with real weights (the built-in model) against transformers."""

from __future__ import annotations

import pytest
import torch

from tests.models.conftest import hf_logits
from wavepp.models import LocalPipeline

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
        from wavepp.store import resolve_model

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


def test_bf16_first_token_matches_fp32_reference(smollm2):
    """Over 30 bf16 layers the top logprobs move by up to ~0.1 (transformers' own bf16 run
    moves them as much); the greedy token must not change on these prompts."""
    path, prompts = smollm2
    pipe = LocalPipeline(path, dtype=torch.bfloat16, num_blocks=32, block_size=16)
    for index, ids in enumerate(prompts):
        logprobs = pipe.prefill(index, ids, chunk_sizes=[3, len(ids) - 3]).log_softmax(-1)
        expected = hf_logits(path, ids)[-1].log_softmax(-1)
        assert int(logprobs.argmax()) == int(expected.argmax())
        greedy = int(expected.argmax())
        assert abs(float(logprobs[greedy] - expected[greedy])) < 0.15
