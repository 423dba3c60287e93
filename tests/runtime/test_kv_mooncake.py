"""The KV hand-off over Mooncake's transfer engine, engine to puller, against transformers: each
stage keeps its part in an arena of its own; a puller with its own transfer engine reads every
stage's part straight from that stage's memory (stage 1 is another process), and what it reads
is the prompt's KV cache. A part released, given up by rank 0, or freed by the TTL cannot be
pulled any more; the arenas are empty after."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from tests.eventually import eventually
from wavepp.engine import Engine
from wavepp.kv_transfer.decode_plan import plan_arena
from wavepp.kv_transfer.mooncake.background import BackgroundPulls
from wavepp.kv_transfer.mooncake.part import prompt_digest
from wavepp.kv_transfer.mooncake.puller import ArenaPuller, PullFailed
from wavepp.kv_transfer.usage import ArenaUsage

from .helpers import VOCAB, assert_clean

pytestmark = pytest.mark.slow


def mooncake_engine(model, **options) -> Engine:
    """A PP = 2 engine handing the KV on over the transfer engine, on loopback."""
    options = dict(kv_arena_gib=0.05, profile_waves=False) | options
    return Engine(
        str(model),
        pp=2,
        dtype="float32",
        kv_transport="mooncake",
        kv_host="127.0.0.1",
        **options,
    )


def arenas(engine) -> dict[int, ArenaUsage]:
    return engine.kv_transfer_usage().arenas


def test_each_stage_part_is_pulled_from_its_own_arena_and_is_the_prompts_cache(tiny):
    reference = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    cfg = reference.config
    rng = random.Random(3)
    prefix = [rng.randrange(VOCAB) for _ in range(70)]
    prompts = [prefix + [rng.randrange(VOCAB) for _ in range(n)] for n in (23, 9)]
    puller = ArenaPuller("127.0.0.1")
    with mooncake_engine(tiny) as engine:
        results = [engine.submit(p, kv_transfer=True).result(timeout=60) for p in prompts]
        assert results[1].num_cached_tokens == 64  # reused blocks are handed on too
        for prompt, result in zip(prompts, results):
            params = result.kv_transfer
            assert "error" not in params, params
            assert params["prompt_digest"] == prompt_digest(prompt)
            stages = params["stages"]
            assert len(stages) == 2 and stages[0]["session"] != stages[1]["session"]
            width = cfg.num_key_value_heads * cfg.head_dim
            plan = plan_arena(
                params, prompt, num_computed=0, num_layers=cfg.num_hidden_layers, kv_width=width
            )
            assert plan.num_tokens == len(prompt) - 1, plan.reason
            with torch.no_grad():
                ref = reference(torch.tensor([prompt]), use_cache=True).past_key_values
            start, end = 5, len(prompt) - 1  # any run of tokens, not only from the first
            rows = puller.pull(stages, start, end)
            assert sorted(rows) == list(range(cfg.num_hidden_layers))
            for layer, pools in rows.items():
                for pool, cached in (
                    ("key", ref.layers[layer].keys),
                    ("value", ref.layers[layer].values),
                ):
                    expect = cached[0].transpose(0, 1).flatten(1)[start:end]
                    torch.testing.assert_close(pools[pool], expect, atol=1e-4, rtol=1e-4)
        eventually(lambda: [a.num_entries for a in arenas(engine).values()] == [2, 2])

        # released by the decode side: freed on both stages, and no longer pulled
        puller.release(results[0].kv_transfer["stages"])
        eventually(lambda: [a.num_entries for a in arenas(engine).values()] == [1, 1])
        with pytest.raises(PullFailed, match="freed"):
            puller.pull(results[0].kv_transfer["stages"], 0, 8)
        # given up by rank 0 (the router's DELETE after a failed decode)
        assert engine.drop_transfer(results[1].kv_transfer["transfer_id"])
        assert not engine.drop_transfer("wpp-never-opened")
        eventually(lambda: [a.num_bytes for a in arenas(engine).values()] == [0, 0])
        with pytest.raises(PullFailed):
            puller.pull(results[1].kv_transfer["stages"], 0, 8)
        assert_clean(engine)
    puller.close()


def test_an_arena_frees_parts_past_their_ttl_and_refuses_one_larger_than_itself(tiny):
    rng = random.Random(4)
    prompt = [rng.randrange(VOCAB) for _ in range(60)]
    puller = ArenaPuller("127.0.0.1")
    # 16 KiB: a stage's part of 60 tokens is 32 KiB (4 whole blocks of 16 rows, 2 layers, K and
    # V, 32 fp32 values a row)
    with mooncake_engine(tiny, kv_ttl_s=0.5, kv_arena_gib=16 * 2**-20) as engine:
        refused = engine.submit(prompt, kv_transfer=True).result(timeout=60)
        assert refused.first_token_id is not None  # the prefill's answer stands
        assert "needs 32.0 KiB; this stage's arena holds 16.0 KiB" in refused.kv_transfer["error"]
        short = prompt[:20]
        kept = engine.submit(short, kv_transfer=True).result(timeout=60)
        assert "error" not in kept.kv_transfer
        eventually(lambda: [a.num_entries for a in arenas(engine).values()] == [0, 0], timeout_s=10)
        with pytest.raises(PullFailed, match="freed"):
            puller.pull(kept.kv_transfer["stages"], 0, 19)
    puller.close()


def test_background_pulls_equal_the_step_s_own_and_release_what_they_pulled(tiny):
    """The decode side's pulls off vLLM's step (BackgroundPulls): the rows equal a pull inside
    the step, bit for bit; three pulls whose rows are not written yet hold three pullers on one
    engine; `done` releases the parts on both stages; a part freed before its pull fails it."""
    rng = random.Random(7)
    prompts = [[rng.randrange(VOCAB) for _ in range(40 + 7 * i)] for i in range(4)]
    puller = ArenaPuller("127.0.0.1")
    pulls = BackgroundPulls("127.0.0.1")
    with mooncake_engine(tiny) as engine:
        results = [engine.submit(p, kv_transfer=True).result(timeout=60) for p in prompts]
        stages = [r.kv_transfer["stages"] for r in results]
        for i in range(3):
            pulls.submit(i, stages[i], 2, len(prompts[i]) - 1)
        ended: dict = {}
        assert eventually(
            lambda: len(ended.update((e.key, e.result) for e in pulls.finished(0.1)) or ended) == 3
        )
        assert pulls.num_pullers == 3 and pulls.num_pending == 0
        engines = {id(p.engine) for p in pulls._pullers}
        assert len(engines) == 1  # one transfer engine for all of them
        for i in range(3):
            expect = puller.pull(stages[i], 2, len(prompts[i]) - 1)
            assert sorted(ended[i]) == sorted(expect)
            for layer, pools in expect.items():
                for pool, rows in pools.items():
                    assert torch.equal(ended[i][layer][pool], rows), (i, layer, pool)
        for i in range(3):
            pulls.done(i, stages[i])
        assert eventually(lambda: [a.num_entries for a in arenas(engine).values()] == [1, 1])
        # a part released before its pull: the pull fails, no rows
        puller.release(stages[3])
        assert eventually(lambda: [a.num_entries for a in arenas(engine).values()] == [0, 0])
        pulls.submit("late", stages[3], 0, 8)
        (late,) = eventually_finished(pulls)
        assert late.key == "late" and isinstance(late.result, PullFailed)
        assert "freed" in str(late.result) and late.wait_s >= 0 and late.pull_s > 0
        pulls.done("late", stages[3])
        assert pulls.num_pullers == 3  # a freed puller took the pull
        assert_clean(engine)
    pulls.close()
    puller.close()


def eventually_finished(pulls: BackgroundPulls, timeout_s: float = 20) -> list:
    out: list = []
    assert eventually(lambda: out.extend(pulls.finished(0.1)) or out, timeout_s=timeout_s)
    return out
