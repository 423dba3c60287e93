"""Priorities (sched/waiting.py): the waiting queue's order, the bound on starvation, and, in
deterministic virtual time, a high-priority prompt's first token beside a stream of low ones
that keeps the pipeline full."""

import random

import pytest

from wavepp.sched.cost_model import CostCoefficients
from wavepp.sched.request import Request
from wavepp.sched.waiting import WaitingQueue
from wavepp.sim import CpuHardware

BS = 16
# a CPU-like stage: 2 ms a wave, 0.4 ms a token (about the built-in model's on this machine)
CPU = CpuHardware(
    (CostCoefficients(c_wave=2e-3, c0=2e-4, g=1e-7, b=4e-4, a=1e-9),) * 2,
    transfer_latency_s=1e-4,
    result_latency_s=1e-4,
)


def req(seq: int, priority: int = 0, arrival: float = 0.0) -> Request:
    r = Request.create(seq, [seq + 1] * 20, BS, arrival_time=arrival)
    r.seq, r.priority = seq, priority
    return r


def test_fcfs_keeps_arrival_order_whatever_comes_back():
    q = WaitingQueue("fcfs")
    reqs = [req(i, priority=-i) for i in range(5)]  # priorities are ignored under fcfs
    for r in reqs:
        q.push(r)
    first = q.take(2, lambda r: True, now=0.0)
    assert first == reqs[:2]
    q.push(first[1])  # refused for room: back at its place, ahead of later arrivals
    q.push(first[0])
    assert list(q) == reqs
    # one not ready (waits for a wave) keeps its place; the others go past it this time only
    assert q.take(3, lambda r: r is not reqs[0], now=0.0) == reqs[1:4]
    assert list(q) == [reqs[0], reqs[4]]


def test_priority_then_arrival_and_aging_bounds_the_wait():
    """A request of priority 3 behind a stream of priority 0 arriving one a second, each taken
    at once: it goes once 3 aging steps (6 s) have made it level 0 and it is the oldest."""
    q = WaitingQueue("priority", aging_s=2.0)
    old_low = req(0, priority=3, arrival=0.0)
    q.push(old_low)
    taken = []
    for t in range(1, 9):
        high = req(t, priority=0, arrival=float(t))
        q.push(high)
        taken.append(q.take(1, lambda r: True, now=float(t))[0])
    assert taken.index(old_low) == 5  # at t = 6, ahead of that second's high
    assert [r.seq for r in taken if r is not old_low] == [1, 2, 3, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="scheduling policy"):
        WaitingQueue("lifo")


def _high_ttft(policy: str, with_stream: bool) -> float:
    """A 256-token prompt of priority 0 arriving at 0.5 s, beside (or without) a stream of
    512-token prompts of priority 1, 16 outstanding, that keeps the pipeline full."""
    sim = CPU.build("wavepp", stage_num_blocks=4096, block_size=BS)
    sim.leader.waiting = WaitingQueue(policy, aging_s=60.0)
    rng = random.Random(7)
    lows = iter(range(1, 400))

    def send_low(*_):
        i = next(lows, None)
        if i is not None and with_stream:
            sim.submit(i, [rng.randrange(30000) for _ in range(512)], priority=1)

    if with_stream:
        sim.on_finish = send_low
        for _ in range(16):
            send_low()
    sim.submit(0, [rng.randrange(30000) for _ in range(256)], at=0.5, priority=0)
    sim.run(until=60.0)
    record = sim.records[0]
    assert record.finish is not None
    return record.finish - record.arrival


def test_a_high_priority_prompt_beside_a_full_pipeline_of_low_ones():
    alone = _high_ttft("priority", with_stream=False)
    behind_fcfs = _high_ttft("fcfs", with_stream=False)
    assert behind_fcfs == pytest.approx(alone)  # alone, the order changes nothing
    fcfs = _high_ttft("fcfs", with_stream=True)
    priority = _high_ttft("priority", with_stream=True)
    assert priority <= 1.5 * alone, (priority, alone)
    assert fcfs > 2 * priority, (fcfs, priority)  # first come, it waits behind the stream
