"""A request's whole life through the leader: it ends exactly once, leaves nothing behind, and
no request waits forever on one that left (aborts, resubmissions, a long-running process)."""

import random

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from wavepp.sched import RequestState
from wavepp.sim import build_sim

from .conftest import grouped_prompts, linear_costs


def assert_drained(sim):
    leader = sim.leader
    assert leader.idle, (
        len(leader.waiting),
        [(r.request_id, r.state, r.dependencies) for r in leader.plannable],
    )
    assert leader.state_size() == 0 and not leader.requests and len(leader.inflight) == 0
    for server in sim.servers:
        cap = server.pool.capacity()
        assert cap.num_leased == cap.num_escrowed == cap.num_pending == cap.num_in_use == 0
        assert not server.requests and not server._probed
        server.pool.check_integrity()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(["wavepp", "lockstep", "static"]),
    abort_rate=st.sampled_from([0.05, 0.15, 0.4]),
)
@example(seed=1920, policy="static", abort_rate=0.05)  # a release ran between lease and commit
def test_aborted_prompts_resubmitted_twice_all_finish(seed, policy, abort_rate):
    """Aborts at random events, each followed by two resubmissions of the aborted prompt (they
    reuse and compute the same blocks the aborted one owned): every request ends, none waits
    on a request that left."""
    rng = random.Random(seed)
    prompts = grouped_prompts(3, 8, prefix_len=24, suffix_len=9, seed=seed)
    sim = build_sim(
        policy,
        2,
        linear_costs(round_latency_s=2e-4, round_item_s=1e-5),
        stage_num_blocks=[40, 64],
        block_size=4,
        check_integrity=True,
    )
    ended: dict[int, int] = {}
    sim.on_finish = lambda rid, now: ended.__setitem__(rid, ended.get(rid, 0) + 1)
    for i, p in enumerate(prompts):
        sim.submit(i, p, at=i * 1e-4)
    next_id = 1000
    submitted = len(prompts)

    def maybe_abort():
        nonlocal next_id, submitted
        live = [rid for rid in sim.leader.requests if rid < 1000]
        if live and rng.random() < abort_rate:
            rid = rng.choice(live)
            sim.abort(rid)
            for _ in range(2):
                sim.submit(next_id, prompts[rid])
                next_id += 1
                submitted += 1

    sim.loop.run(after_event=maybe_abort)
    assert_drained(sim)
    assert len(ended) == submitted and set(ended.values()) == {1}  # each ended exactly once
    resubmitted = [r for rid, r in sim.records.items() if rid >= 1000]
    assert all(r.failure is None for r in resubmitted)


def test_twenty_thousand_requests_leave_no_state_behind():
    """A long-running leader: its state is bounded by the requests outstanding, not served."""
    prompts = grouped_prompts(8, 2500, prefix_len=8, suffix_len=3, vocab=50, seed=3)
    sim = build_sim(
        "wavepp",
        2,
        linear_costs(per_token_s=1e-6, per_chunk_s=1e-6, per_wave_s=1e-6),
        stage_num_blocks=[256, 256],
        block_size=4,
    )
    concurrency, sizes, next_index = 16, [], 0

    def submit_next(*_):
        nonlocal next_index
        sizes.append(sim.leader.state_size())
        if next_index < len(prompts):
            next_index += 1
            sim.submit(next_index - 1, prompts[next_index - 1])

    sim.on_finish = submit_next
    for _ in range(concurrency):
        submit_next()
    sim.run()
    assert len(sim.records) == 20_000 and all(r.failure is None for r in sim.records.values())
    # per request outstanding, at most: its entry, its queue slot, its blocks being computed
    assert max(sizes) <= concurrency * 8
    assert_drained(sim)


def test_an_ended_request_is_handed_over_once_and_forgotten():
    sim = build_sim("static", 2, linear_costs(), stage_num_blocks=[64, 64], block_size=4)
    sim.submit(0, list(range(1, 30)))
    sim.submit(1, list(range(1, 30)))
    sim.abort(1)
    sim.run()
    assert sim.leader.take_finished() == []  # the simulator took them already
    assert sim.records[0].failure is None and sim.records[1].failure == "aborted"
    assert 0 not in sim.leader.requests and 1 not in sim.leader.requests
    req = sim.leader.add_request(0, [5, 6, 7])  # an ended id is free again
    assert req.state == RequestState.WAITING
