"""trtllm-pp and sglang-pp on the real pipeline: the same first tokens as wavepp, the ideal
prefix hits, clean caches after aborts, and the loops' own properties (a round with every stage
before each microbatch, P slots retired P-1 iterations late, serial chunks under trtllm-pp,
SGLang's chunk sizes under sglang-pp)."""

import random
import time
from concurrent.futures import wait

import pytest

from wavepp.engine import Engine
from wavepp.random_checkpoint import make_model
from wavepp.sched import CostCoefficients, CostModel

from .helpers import VOCAB, assert_clean, groups

BS = 16
LOOPS = ("trtllm-pp", "sglang-pp")


def prompts_with_prefixes(seed, num=24, prefix_len=96):
    """Shared 96-token prefixes, suffixes of 1-380 tokens: some prompts span two 256-token
    microbatches."""
    rng = random.Random(seed)
    heads = groups(rng, num_groups=4, prefix_len=prefix_len)
    return [
        heads[i % 4] + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 380))]
        for i in range(num)
    ]


def ideal_cached_tokens(prompts):
    """Per prompt: the longest block-aligned prefix shared with an earlier prompt, leaving at
    least its last token to compute."""
    out = []
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            n = 0
            while n < min(len(p), len(q)) and p[n] == q[n]:
                n += 1
            best = max(best, n // BS * BS)
        out.append(min(best, (len(p) - 1) // BS * BS))
    return out


@pytest.mark.parametrize("pp", [2, 3])
def test_loops_give_wavepp_first_tokens_and_ideal_hits(tiny, pp):
    prompts = prompts_with_prefixes(seed=pp)
    ideal = ideal_cached_tokens(prompts)
    assert sum(ideal) > 0
    with Engine(str(tiny), pp=pp, dtype="float32", block_size=BS) as engine:
        ref = engine.prefill(prompts)
        for policy in LOOPS:
            engine.reset(policy)
            results = engine.prefill(prompts)
            for i, (r, w) in enumerate(zip(results, ref)):
                assert r.ok, (policy, i, r.error)
                assert r.first_token_id == w.first_token_id, (policy, i)
                assert r.first_token_logprob == pytest.approx(w.first_token_logprob, abs=1e-4), (
                    policy,
                    i,
                )
            assert [r.num_cached_tokens for r in results] == ideal, policy
            stats = engine.stats()
            # a round (or the empty request list) with every stage before each microbatch
            assert stats.num_rounds >= stats.num_waves > 0, policy
            assert_clean(engine)


def test_trtllm_keeps_one_chunk_per_request_in_flight_and_retires_late(tiny):
    prompts = prompts_with_prefixes(seed=11)
    with Engine(str(tiny), pp=3, policy="trtllm-pp", dtype="float32", block_size=BS) as engine:
        results = engine.prefill(prompts)
        assert all(r.ok for r in results)
        loop = engine._core._loops.outside
        records = list(loop.records)
        stats = engine.stats()
    assert len(records) == stats.num_waves
    # every microbatch is retired by the iteration that reuses its slot, P - 1 = 2 later
    assert all(r.retired == r.launched + 2 for r in records)
    assert max(c[2] for r in records for c in r.chunks) <= 256
    chunks_of = {}
    for r in records:
        for request_id, start, _num_tokens, _is_last in r.chunks:
            chunks_of.setdefault(request_id, []).append((start, r.launched, r.retired))
    assert any(len(c) > 1 for c in chunks_of.values())  # some prompts took several chunks
    for request_id, chunks in chunks_of.items():
        chunks.sort()
        for (_, _, retired), (_, launched, _) in zip(chunks, chunks[1:]):
            assert launched > retired, request_id  # the next chunk after the last came back
    # iterations with nothing to admit still passed the (empty) request list to every stage
    assert stats.num_rounds >= loop.num_exchanges == loop.iteration
    assert any(not r.admitted for r in records)


@pytest.fixture(scope="module")
def tiny_long(tmp_path_factory):
    """The tiny model with room for prompts longer than SGLang's base chunk (512 here)."""
    return make_model(
        tmp_path_factory.mktemp("tiny_long") / "llama",
        arch="llama",
        num_layers=4,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
        seed=7,
    )


def test_sglang_chunks_follow_dynamic_chunking(tiny_long):
    # a strongly quadratic prefill cost (as SGLang fits at warm-up): later chunks shrink
    coef = CostCoefficients(c_wave=0.0, c0=0.0, g=0.0, b=1e-6, a=1e-6, knee_tokens=0.0)
    rng = random.Random(3)
    head = [rng.randrange(VOCAB) for _ in range(96)]
    prompts = [
        head + [rng.randrange(VOCAB) for _ in range(rng.randrange(600, 1400))] for _ in range(8)
    ]
    with Engine(str(tiny_long), pp=2, policy="sglang-pp", dtype="float32", block_size=BS) as engine:
        planner = engine._core.leader.planner
        planner.cost = CostModel(coef)
        results = engine.prefill(prompts)
        assert all(r.ok for r in results)
        records = list(engine._core._loops.outside.records)
        assert_clean(engine)
    shrunk = 0
    for r in records:
        request_id, start, num_tokens, is_last = r.chunks[0]
        budget = planner.chunk_budget(start)
        assert sum(c[2] for c in r.chunks) <= budget
        if not is_last:
            assert num_tokens == budget, (r.wave_id, start, num_tokens, budget)
            shrunk += budget < planner.base
    assert shrunk > 0
    assert all(r.retired == r.launched + 1 for r in records)


@pytest.mark.parametrize("policy", LOOPS)
def test_aborts_leave_every_stage_clean(tiny, policy):
    prompts = prompts_with_prefixes(seed=21, num=40)
    rng = random.Random(5)
    with Engine(
        str(tiny),
        pp=3,
        policy=policy,
        dtype="float32",
        block_size=BS,
        stage_num_blocks=[48, 64, 40],
    ) as engine:
        futures = [engine.submit(p) for p in prompts]
        for _ in range(12):
            engine.abort(rng.choice(futures).request_id)
            time.sleep(rng.random() * 0.01)
        wait(futures, timeout=120)
        results = [f.result() for f in futures]
        assert sum(r.error == "aborted" for r in results) > 0
        assert all(r.ok or r.error == "aborted" for r in results)
        assert_clean(engine)
        again = engine.prefill(prompts[:8])  # and the pipeline goes on
        assert all(r.ok for r in again)
        assert_clean(engine)
