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


def test_kimi_linear_snapshots_come_back_from_the_host_tier(tmp_path):
    """A hybrid model (Kimi-Linear: KDA layers with recurrent state, MLA, MoE): a cycle of
    prefix groups larger than the pools, so prefixes and their state snapshots leave for the
    host tier and come back with them; every first token and its logprobs are transformers'."""
    kimi = make_model(tmp_path / "kimi", arch="kimi_linear", num_layers=4, seed=3)
    rng = random.Random(8)
    groups = [[rng.randrange(VOCAB) for _ in range(40)] for _ in range(4)]  # 10 blocks of 4
    prompts = [g + [rng.randrange(VOCAB) for _ in range(3 + r)] for r in range(3) for g in groups]
    model = transformers.AutoModelForCausalLM.from_pretrained(kimi, dtype=torch.float32).eval()
    with torch.no_grad():
        refs = [
            torch.log_softmax(model(torch.tensor([p])).logits[0, -1].float(), -1) for p in prompts
        ]
    results = {}
    for gib in (0.0, 0.01):
        with Engine(
            str(kimi),
            pp=2,
            dtype="float32",
            block_size=4,
            stage_num_blocks=[28, 28],  # 12 blocks a prompt: about two groups' prefixes
            snapshot_interval_blocks=2,
            profile_waves=False,
            host_kv_gib=gib,
        ) as engine:
            results[gib] = [engine.prefill([p])[0] for p in prompts]
            loaded = [c.counters.host_loaded_blocks for c in engine.stage_cache_counters()]
            assert_clean(engine)
        if gib:
            assert min(loaded) > 0  # every stage loaded blocks (and states) back
    cached = {gib: sum(r.num_cached_tokens for r in rs) for gib, rs in results.items()}
    assert cached[0.01] > cached[0.0]
    for rs in results.values():
        for r, ref in zip(rs, refs):
            assert r.ok, r.error
            top = torch.topk(ref, len(r.top_logprobs))
            assert r.first_token_id == int(top.indices[0])
            for (_, lp), want in zip(r.top_logprobs, top.values.tolist()):
                assert abs(lp - want) <= 1e-4, (lp, want)


def test_kimi_linear_resumes_before_the_pools_prefix_ends(tmp_path, monkeypatch):
    """Few snapshot slots (PP = 1, in this process, so the slots can be made scarce): a pool
    keeps a prefix's blocks but evicts their snapshots alone to the host tier, so a load
    resumes at the pool's last snapshot, copies the pool's blocks after it into the request's
    own, and loads the states from the host; the tokens stay transformers'."""
    from wavepp.models import stage_pool
    from wavepp.runtime.host_kv import HostKVStore

    monkeypatch.setattr(stage_pool, "num_snapshot_slots", lambda num_blocks, interval: 8)
    copies = []
    stage_blocks = HostKVStore.stage_blocks

    def spy(self, block_ids):
        copies.append(len(block_ids))
        return stage_blocks(self, block_ids)

    monkeypatch.setattr(HostKVStore, "stage_blocks", spy)
    kimi = make_model(tmp_path / "kimi", arch="kimi_linear", num_layers=4, seed=3)
    rng = random.Random(9)
    groups = [[rng.randrange(VOCAB) for _ in range(40)] for _ in range(3)]
    prompts = [g + [rng.randrange(VOCAB) for _ in range(3 + r)] for r in range(3) for g in groups]
    model = transformers.AutoModelForCausalLM.from_pretrained(kimi, dtype=torch.float32).eval()
    with torch.no_grad():
        refs = [
            torch.log_softmax(model(torch.tensor([p])).logits[0, -1].float(), -1) for p in prompts
        ]
    with Engine(
        str(kimi),
        pp=1,
        dtype="float32",
        block_size=4,
        stage_num_blocks=[30],
        snapshot_interval_blocks=2,
        profile_waves=False,
        host_kv_gib=0.01,
    ) as engine:
        results = [engine.prefill([p])[0] for p in prompts]
        assert_clean(engine)
    assert any(n > 0 for n in copies)  # a load resumed before the pool's prefix ended
    for r, ref in zip(results, refs):
        assert r.ok, r.error
        top = torch.topk(ref, len(r.top_logprobs))
        assert r.first_token_id == int(top.indices[0])
        for (_, lp), want in zip(r.top_logprobs, top.values.tolist()):
            assert abs(lp - want) <= 1e-4, (lp, want)
