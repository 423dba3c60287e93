"""Nothing hangs, nothing leaks: one engine under aborts, bad input and colliding ids.

Each test is a failure that was seen: a request waiting forever on an aborted one, a prompt
past the model's positions killing the pipeline, a duplicate id losing a result, input
silently converted. (Starting and stopping: test_lifecycle.py.)
"""

import random
from concurrent.futures import wait

import pytest

from wavepp.engine import Engine

from .helpers import MAX_POSITIONS, VOCAB, assert_clean, groups


@pytest.fixture(scope="module")
def engine(tiny):
    with Engine(str(tiny), pp=2, dtype="float32", stage_num_blocks=[96, 128]) as eng:
        yield eng


def test_resubmitted_aborted_prompts_finish(engine):
    rng = random.Random(1)
    prefixes = groups(rng)
    prompts, futures = {}, {}
    for i in range(200):
        prompts[i] = prefixes[i % 8] + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 40))]
        futures[i] = engine.submit(prompts[i], request_id=i)
        if rng.random() < 0.33:
            engine.abort(rng.choice(list(futures)))
    done, pending = wait(list(futures.values()), timeout=60)
    assert not pending
    aborted = [i for i, f in futures.items() if f.result().error == "aborted"]
    assert aborted
    again = [engine.submit(prompts[i]) for i in aborted[:20] for _ in range(2)]
    done, pending = wait(again, timeout=60)
    assert not pending and all(f.result().ok for f in again)
    assert_clean(engine)


def test_prompt_past_the_model_positions_fails_alone(engine):
    rng = random.Random(2)
    good = [engine.submit([rng.randrange(VOCAB) for _ in range(40)]) for _ in range(16)]
    long = engine.submit([rng.randrange(VOCAB) for _ in range(MAX_POSITIONS + 1)])
    result = long.result(timeout=10)
    assert not result.ok and f"at most {MAX_POSITIONS}" in result.error
    assert all(f.result(timeout=60).ok for f in good)
    assert engine.submit([1, 2, 3]).result(timeout=30).ok  # the engine still serves
    assert engine.submit([7] * MAX_POSITIONS).result(timeout=60).ok  # the longest that fits


def test_request_ids_duplicate_colliding_and_reused(engine):
    first = engine.submit([5] * 300, request_id=2000)
    with pytest.raises(ValueError, match="2000 is already in use"):
        engine.submit([6, 7], request_id=2000)
    assert first.result(timeout=30).ok and first.result().request_id == 2000
    # an explicit id that an automatic one would take next: automatic ids step over it
    auto = engine.submit([1, 2, 3])
    taken = auto.result(timeout=30).request_id + 1
    blocker = engine.submit([9] * 200, request_id=taken)
    more = [engine.submit([1, 2, 3, i]) for i in range(4)]
    assert all(f.result(timeout=30).ok for f in more + [blocker])
    assert taken not in [f.result().request_id for f in more]
    # a finished id is free again
    assert engine.submit([4, 4], request_id=2000).result(timeout=30).request_id == 2000
    with pytest.raises(ValueError, match="request_id must be an int"):
        engine.submit([1], request_id="7")


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([1, 2.7, 3], "token 1 of the prompt is 2.7"),
        ([1, True], "token 1 of the prompt is True"),
        (b"abc", "not bytes"),
        ([[1, 2]], "token 0 of the prompt is \\[1, 2\\]"),
        ([], "empty prompt"),
        ([1, VOCAB], "outside the vocabulary"),
        (None, "got NoneType"),
    ],
)
def test_bad_prompts_are_refused_not_converted(engine, prompt, message):
    with pytest.raises(ValueError, match=message):
        engine.submit(prompt)


def test_a_second_pipeline_in_the_same_process_fails_at_once(tiny, engine):
    with pytest.raises(RuntimeError, match="another pipeline .* is running in this process"):
        Engine(str(tiny), pp=2, dtype="float32")
    assert engine.submit([1, 2, 3]).result(timeout=30).ok  # the first one is unaffected


def test_a_bad_prompt_in_a_batch_refuses_the_batch_before_queuing_any(engine):
    before = engine._core.leader._next_wave_id
    with pytest.raises(ValueError, match="prompt 2: empty prompt"):
        engine.prefill([[1, 2, 3], [4, 5], [], [6]])
    assert engine._core.num_live_requests == 0 and engine._core.leader._next_wave_id == before
    assert [r.ok for r in engine.prefill([[1, 2, 3], [4, 5]])] == [True, True]


def test_fp32_cached_and_cold_agree_to_rounding(engine):
    """The same prompt cold, then with its prefix cached: the same first token, and logprobs
    equal to fp32 rounding (not bit for bit: GEMM kernels block and sum a 1-row chunk in
    another order than a 500-row one; the README states the measured difference)."""
    rng = random.Random(4)
    for n in (17, 100, 333):
        prompt = [rng.randrange(VOCAB) for _ in range(n)]
        cold = engine.submit(prompt).result(timeout=30)
        cached = engine.submit(prompt).result(timeout=30)
        assert cold.num_cached_tokens == 0 and cached.num_cached_tokens == (n - 1) // 16 * 16
        assert cached.first_token_id == cold.first_token_id
        cold_lp, cached_lp = dict(cold.top_logprobs), dict(cached.top_logprobs)
        assert max(abs(cold_lp[t] - cached_lp[t]) for t in cold_lp if t in cached_lp) <= 1e-4
