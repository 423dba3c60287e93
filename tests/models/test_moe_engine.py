"""The real pipeline (Engine, PP = 2, one process per stage) on each tiny MoE / MLA / DSA
model: first tokens and their logprobs as transformers computes them, prefixes reused."""

from __future__ import annotations

import pytest

from tests.models.test_moe_families import reference_logits, stable_topk
from tests.prompts import two_prefix_prompts
from wavepp.engine import Engine
from wavepp.random_checkpoint import MOE_ARCHS, make_model

VOCAB = 256


def _prompts(seed: int) -> list[list[int]]:
    return two_prefix_prompts(VOCAB, seed, per_prefix=3)


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_engine_pp2_first_tokens_match_transformers(tmp_path, arch):
    # GLM-5 keeps 4 keys per query: its stage boundary (before a shared layer) carries top-k
    path = make_model(tmp_path / arch, arch=arch, seed=5, index_topk=4)
    prompts = _prompts(seed=len(arch))
    with stable_topk():  # wavepp's tie rule for DSA (see test_moe_families)
        reference = [reference_logits(path, p)[-1].log_softmax(-1) for p in prompts]
    with Engine(
        str(path),
        pp=2,
        dtype="float32",
        block_size=4,
        stage_num_blocks=[64, 64],
        layer_split="even",  # GLM-5's boundary before layer 2, a shared one (not auto's)
    ) as engine:
        first = engine.prefill(prompts)
        again = engine.prefill(prompts)
    for results in (first, again):
        for r, lp in zip(results, reference):
            assert r.ok, r.error
            assert r.first_token_id == int(lp.argmax())
            assert abs(r.first_token_logprob - float(lp.max())) < 1e-4
    assert all(r.num_cached_tokens > 0 for r in again)
    assert sum(r.num_cached_tokens for r in first) > 0  # the shared prefixes
