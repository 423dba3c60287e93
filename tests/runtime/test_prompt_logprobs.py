"""Prompt logprobs (logprob_start) through the pipeline, against transformers' log-softmax at
every position of the same fp32 checkpoint (within FP32_ATOL, the runtime's fp32 bound), and
the reuse cap: positions from logprob_start on are computed, the blocks before it reused."""

from __future__ import annotations

import random

import pytest
import torch

from tests.models.conftest import hf_logits
from wavepp.engine import Engine
from wavepp.sched import Request

from .helpers import VOCAB, assert_clean

pytestmark = pytest.mark.slow
FP32_ATOL = 1e-4


def _ref(path, ids):
    return torch.log_softmax(hf_logits(path, ids), dim=-1)


def _assert_prompt_logprobs(result, ref, ids, start):
    got = result.prompt_logprobs
    assert len(got) == len(ids) - 1 - start
    for i, (lp, top) in enumerate(got):
        p = start + i
        assert abs(lp - float(ref[p, ids[p + 1]])) < FP32_ATOL, (p, lp)
        top_lp = ref[p].topk(len(top)).values.tolist()
        # near-ties may swap ids; each id's logprob and the top values agree
        assert max(abs(lp_t - float(ref[p, t])) for t, lp_t in top) < FP32_ATOL
        assert max(abs(a - b) for (_, a), b in zip(top, top_lp)) < FP32_ATOL
    assert abs(result.first_token_logprob - float(ref[-1].max())) < FP32_ATOL


@pytest.mark.parametrize("policy", ["wavepp", "static"])
def test_prompt_logprobs_match_transformers_with_reuse_capped(tiny, policy):
    rng = random.Random(11)
    ids = [rng.randrange(VOCAB) for _ in range(70)]
    long_ids = [rng.randrange(VOCAB) for _ in range(480)]
    ref = _ref(tiny, ids)
    with Engine(str(tiny), pp=2, policy=policy, dtype="float32", top_k=3) as engine:
        cold = engine.submit(ids, logprob_start=0).result()
        assert cold.num_cached_tokens == 0
        _assert_prompt_logprobs(cold, ref, ids, 0)
        warm = engine.submit(ids).result()  # no prompt logprobs: full reuse
        assert warm.num_cached_tokens == 64 and warm.prompt_logprobs is None
        capped = engine.submit(ids, logprob_start=40).result()
        assert capped.num_cached_tokens == 32  # the blocks before position 40's block
        _assert_prompt_logprobs(capped, ref, ids, 40)
        again = engine.submit(ids, logprob_start=0).result()
        assert again.num_cached_tokens == 0
        _assert_prompt_logprobs(again, ref, ids, 0)
        last = engine.submit(
            ids, logprob_start=69
        ).result()  # the last position: no prompt token after it
        assert last.prompt_logprobs == () and last.num_cached_tokens == 64
        # a long prompt, beside others, so that its positions come back in several chunks
        futures = [engine.submit(long_ids, logprob_start=3)] + [
            engine.submit([rng.randrange(VOCAB) for _ in range(200)]) for _ in range(3)
        ]
        _assert_prompt_logprobs(futures[0].result(), _ref(tiny, long_ids), long_ids, 3)
        assert all(f.result().ok for f in futures)
        with pytest.raises(ValueError, match="logprob_start"):
            engine.submit(ids, logprob_start=70)
        assert_clean(engine)


def test_request_reuse_cap_and_chunk_targets():
    req = Request.create(0, list(range(40)), 4)
    assert req.max_reusable_blocks(4) == 9  # (40 - 1) // 4: the last token is computed
    req.logprob_start = 10
    assert req.max_reusable_blocks(4) == 2  # [0, 8) reused | [8, 40) computed
    assert req.logprob_token_ids(0, 8) == (None, ())
    assert req.logprob_token_ids(8, 12) == (10, (11, 12))
    assert req.logprob_token_ids(12, 40) == (12, tuple(range(13, 40)))


def test_logprob_start_is_set_from_the_request_s_first_round_and_wave(tiny):
    """logprob_start is a submit argument all the way down: the leader creates the request with
    it, so the request's first round already caps its reuse and the first wave that carries
    one of its chunks already asks for its prompt logprobs (no window in which a round could
    see the request without it)."""
    rng = random.Random(13)
    ids = [rng.randrange(VOCAB) for _ in range(70)]
    ref = _ref(tiny, ids)
    starts = (0, 40, 69, None)
    with Engine(str(tiny), pp=2, policy="wavepp", dtype="float32", top_k=3) as engine:
        assert engine.submit(ids).result().ok  # its full blocks are cached on every stage from here
        leader = engine._core.leader
        first_round: dict[int, int | None] = {}  # internal id -> logprob_start at its first round
        waves = []
        start_round, plan_wave = leader.start_round, leader.plan_wave

        def recording_start_round(now):
            step = start_round(now)
            for req in leader.round.requests if step is not None else ():
                first_round.setdefault(req.request_id, req.logprob_start)
            return step

        def recording_plan_wave(now):
            wave = plan_wave(now)
            if wave is not None:
                waves.append(wave)
            return wave

        leader.start_round, leader.plan_wave = recording_start_round, recording_plan_wave
        futures = [engine.submit(ids, logprob_start=s) for s in starts]
        results = [f.result() for f in futures]
        leader.start_round, leader.plan_wave = start_round, plan_wave
        assert_clean(engine)
    assert sorted(first_round.values(), key=lambda s: -1 if s is None else s) == [None, 0, 40, 69]
    for request_id, s in first_round.items():
        first_chunk = min(
            (c for w in waves for c in w.chunks if c.request_id == request_id),
            key=lambda c: c.start,
        )
        asks = s is not None and s < first_chunk.end
        assert first_chunk.logprob_start == (max(first_chunk.start, s) if asks else None), (
            s,
            first_chunk,
        )
    for s, r in zip(starts, results):
        assert r.ok, (s, r.error)
        if s is None:
            assert r.prompt_logprobs is None
            continue
        assert r.num_cached_tokens <= s // 16 * 16, s  # never reused past logprob_start's block
        _assert_prompt_logprobs(r, ref, ids, s)


def test_a_submit_the_leader_refuses_queues_nothing(tiny):
    with Engine(str(tiny), pp=2, policy="wavepp", dtype="float32") as engine:
        with pytest.raises(ValueError, match="logprob_start"):
            engine._core.submit(
                7, [1, 2, 3], logprob_start=3
            )  # past the prompt: the leader refuses
        assert engine._core.num_live_requests == 0
        assert (
            engine.submit([1, 2, 3], 7, logprob_start=2).result().prompt_logprobs == ()
        )  # id 7 is free
        assert_clean(engine)
