"""Priority scheduling on the real pipeline (PP = 2): a prompt of priority 0 sent after a queue
of priority-5 prompts is answered before the prompts queued ahead of it, with the first token
it gets alone; an engine that schedules first come, first served refuses a priority."""

import random

import pytest

from wavepp.engine import Engine

from .helpers import VOCAB


def test_a_high_priority_prompt_passes_the_queue(tiny):
    rng = random.Random(3)
    lows = [[rng.randrange(VOCAB) for _ in range(200)] for _ in range(32)]
    high = [rng.randrange(VOCAB) for _ in range(100)]
    with Engine(str(tiny), pp=2, dtype="float32", scheduling_policy="priority") as engine:
        alone = engine.submit(high).result(timeout=60)
        engine.reset()
        done: list[str] = []
        futures = []
        for i, prompt in enumerate(lows):
            fut = engine.submit(prompt, priority=5)
            fut.add_done_callback(lambda f, name=f"low {i}": done.append(name))
            futures.append(fut)
        fut = engine.submit(high, priority=0)
        fut.add_done_callback(lambda f: done.append("high"))
        answer = fut.result(timeout=60)
        for f in futures:
            assert f.result(timeout=60).ok
    assert answer.first_token_id == alone.first_token_id
    assert answer.priority == 0
    # ahead of it at most the lows already in waves when it was admitted: the ring of 2 x PP
    # waves of at most 512 tokens holds 2,048 tokens, ten of these prompts and one cut
    ring_tokens = 2 * 2 * 512
    assert done.index("high") <= ring_tokens // 200 + 1, done


def test_fcfs_refuses_a_priority(tiny):
    with Engine(str(tiny), pp=2, dtype="float32") as engine:
        with pytest.raises(ValueError, match="priority scheduling is not enabled"):
            engine.submit([1, 2, 3], priority=1)
        with pytest.raises(ValueError, match="priority must be an int"):
            engine.submit([1, 2, 3], priority=True)
        assert engine.submit([1, 2, 3], priority=0).result(timeout=60).ok
