"""The host KV tier end to end: a prefix the stage pools evicted comes back from host memory,
and the first token computed on it matches transformers' own model code (fp32)."""

import random

import pytest
import torch
import transformers

from wavepp.engine import Engine
from wavepp.random_checkpoint import make_model

from .helpers import VOCAB, assert_clean

pytestmark = pytest.mark.slow

PREFIX = 96  # 6 blocks of 16


def _run(model_dir, prompts, host_kv_gib):
    """Each prompt on its own, in order; the results, and the engine's last integrity check."""
    with Engine(
        str(model_dir),
        pp=2,
        dtype="float32",
        block_size=16,
        stage_num_blocks=[12, 12],  # 7 blocks a prompt: a prefix is evicted within a few
        profile_waves=False,
        host_kv_gib=host_kv_gib,
    ) as engine:
        results = [engine.prefill([p])[0] for p in prompts]
        assert_clean(engine)
    return results


@pytest.fixture(scope="module")
def mla_moe(tmp_path_factory):
    """DeepSeek-V3's family at test size: latent attention and MoE layers."""
    return make_model(tmp_path_factory.mktemp("mla") / "deepseek", arch="deepseek_v3", seed=6)


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_an_evicted_prefix_is_loaded_back_from_the_host_tier(family, tiny, mla_moe):
    tiny = tiny if family == "llama" else mla_moe
    rng = random.Random(3)
    prefix = [rng.randrange(VOCAB) for _ in range(PREFIX)]
    others = [[rng.randrange(VOCAB) for _ in range(100)] for _ in range(4)]
    again = prefix + [rng.randrange(VOCAB) for _ in range(9)]
    prompts = [prefix + [rng.randrange(VOCAB) for _ in range(10)], *others, again]
    with_tier = _run(tiny, prompts, host_kv_gib=0.001)  # 1 MiB: 128 blocks of 8 KiB a stage
    without = _run(tiny, prompts, host_kv_gib=0.0)
    assert all(r.ok for r in with_tier + without)
    assert with_tier[-1].num_cached_tokens == PREFIX  # loaded back from host memory
    assert without[-1].num_cached_tokens == 0  # the pools lost it: computed again
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([again])).logits[0, -1].float(), -1)
    top = torch.topk(ref, len(with_tier[-1].top_logprobs))
    for r in (with_tier[-1], without[-1]):
        assert r.first_token_id == int(top.indices[0])
        assert [i for i, _ in r.top_logprobs] == top.indices.tolist()
        for (_, lp), want in zip(r.top_logprobs, top.values.tolist()):
            assert abs(lp - want) <= 1e-4, (lp, want)
