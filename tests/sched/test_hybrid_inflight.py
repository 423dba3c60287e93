"""Hybrid models: prompts that arrive together share their prefix's snapshots in flight.

Every test runs the simulator (the leader, planners and stage servers the runtime runs) with
real snapshot pools and a model of the states: each stage keeps, per slot, the token prefix
whose state a chunk saved there, and every chunk that resumes checks that its slot holds
exactly its own prefix (a wrong, stale or unwritten state fails the test)."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wavepp.sched import RequestState
from wavepp.sched.admission import waits_for_round
from wavepp.sched.planners import PlannerConfig
from wavepp.sched.policy import get_policy
from wavepp.sched.request import Request
from wavepp.sim import build_sim
from wavepp.workloads.workload import snapshot_reusable_tokens

from .conftest import grouped_prompts, linear_costs

BS = 4
POLICIES = ["wavepp", "wavepp-mpu", "static", "lockstep", "trtllm-pp", "sglang-pp"]


class StateModel:
    """Wraps each stage's `prepare`: checks the state every chunk starts from, then records
    the states it saves (the token prefix before each save position)."""

    def __init__(self, sim, prompts: dict[int, list[int]]):
        self.prompts = prompts
        self.num_resumed = 0  # first chunks that started from a snapshot (per stage)
        for server in sim.servers:
            server.prepare = self._wrap(server, server.prepare, {})

    def _wrap(self, server, prepare, slots: dict[int, tuple]):
        def checked(wave):
            prepared = prepare(wave)
            for p in prepared:
                prompt = self.prompts[p.chunk.request_id]
                if p.chunk.start == 0:
                    assert p.state_in is None
                    continue
                assert slots.get(p.state_in) == tuple(prompt[: p.chunk.start]), (
                    f"stage {server.stage_id}: request {p.chunk.request_id} resumes at {p.chunk.start} "
                    f"from slot {p.state_in}, which holds another state"
                )
                if p.chunk.start == server.requests[p.chunk.request_id].num_cached_tokens:
                    self.num_resumed += 1
            for p in prepared:
                prompt = self.prompts[p.chunk.request_id]
                for position, slot in p.state_saves:
                    slots[slot] = tuple(prompt[:position])
            return prepared

        return checked


def hybrid_sim(
    policy: str,
    num_stages: int,
    *,
    interval: int = 4,
    stage_num_blocks=(400, 300, 500),
    planner_config: PlannerConfig | None = None,
    round_latency_s: float = 0.0,
):
    return build_sim(
        policy,
        num_stages,
        linear_costs(round_latency_s=round_latency_s),
        stage_num_blocks=list(stage_num_blocks[:num_stages]),
        block_size=BS,
        check_integrity=True,
        hybrid=True,
        snapshot_interval_blocks=interval,
        planner_config=planner_config,
        loop=get_policy(policy).loop,
    )


def assert_drained(sim):
    assert sim.leader.idle and sim.leader.state_size() == 0
    for server in sim.servers:
        server.pool.check_integrity()
        cap = server.pool.capacity()
        assert cap.num_leased == cap.num_escrowed == cap.num_pending == cap.num_in_use == 0
        assert server.pool.num_pending_snapshots == 0
        assert server.pool.num_free_slots + server.pool.num_snapshots == server.pool.num_slots


@pytest.mark.parametrize("num_stages", [2, 3])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_burst_reuses_the_ideal_on_the_snapshot_grid(policy, num_stages):
    """32 prompts in 8 groups submitted at once: 60 shared tokens (15 blocks of 4) and 9 of
    their own. On a grid of 4 blocks a follower resumes at block 12 (48 tokens), the grid
    point below the shared 15 blocks: the bound is the shared prefix rounded down to the grid.
    Every follower reuses exactly that, though its group's first prompt is still in flight."""
    prompts = grouped_prompts(8, 4, 60, 9, seed=1)
    sim = hybrid_sim(policy, num_stages)
    states = StateModel(sim, dict(enumerate(prompts)))
    for i, p in enumerate(prompts):
        sim.submit(i, p)
    sim.run()
    want = snapshot_reusable_tokens(prompts, BS, 4)
    assert want == [0] * 8 + [48] * 24
    assert [sim.records[i].num_cached_tokens for i in range(32)] == want
    assert all(r.failure is None for r in sim.records.values())
    assert states.num_resumed == 24 * num_stages  # every follower, on every stage
    assert_drained(sim)


@pytest.mark.parametrize("interval", [4, 8])
@pytest.mark.parametrize("policy", POLICIES)
def test_the_benchs_workloads_reach_the_ideal_on_the_grid(policy, interval):
    """`wavepp bench`'s hybrid rows in the simulator: short-suffix (200 shared tokens and 40 of
    their own) and reuse (256 tokens sharing 90%), 16-token blocks, 8 outstanding, 32 requests.
    trtllm-pp finishes its group owners one at a time, so followers arrive while their owner
    computes the prefix: they reach the ideal only by leasing its pending snapshots."""
    from wavepp.sched.policy import get_policy
    from wavepp.sim import run_closed_loop
    from wavepp.workloads import make_workload

    for work in (
        make_workload(
            "short_suffix",
            num_requests=32,
            num_groups=8,
            prefix_len=200,
            suffix_len=40,
            block_size=16,
            seed=0,
        ),
        make_workload(
            "reuse", num_requests=32, num_groups=8, prompt_len=256, block_size=16, seed=0
        ),
    ):
        sim = build_sim(
            policy,
            2,
            linear_costs(per_token_s=1e-4),
            stage_num_blocks=600,
            block_size=16,
            hybrid=True,
            snapshot_interval_blocks=interval,
            loop=get_policy(policy).loop,
        )
        StateModel(sim, dict(enumerate(work.prompts)))
        run_closed_loop(sim, work.prompts, concurrency=8)
        want = snapshot_reusable_tokens(work.prompts, 16, interval)
        assert [sim.records[i].num_cached_tokens for i in range(32)] == want, work.name
        assert_drained(sim)


def _followers(sim) -> list[int]:
    """Requests planned to resume from a state the owner of group 0 has not dispatched yet."""
    return [
        r.request_id for r in sim.leader.plannable if any(d.owner_id == 0 for d in r.dependencies)
    ]


PHASES = {
    # the owner of group 0 is aborted at the first event where this holds; 12 blocks: the
    # boundary its followers resume at
    "waiting": lambda sim, r: r.state is RequestState.WAITING,
    "in its round": lambda sim, r: r.state in (RequestState.PROPOSED, RequestState.LEASED),
    "admitted": lambda sim, r: r.state is RequestState.ADMITTED and _followers(sim),
    "before the boundary": lambda sim, r: 0 < r.num_scheduled_tokens < 12 * BS and _followers(sim),
    "boundary in flight": lambda sim, r: r.num_scheduled_tokens >= 12 * BS > r.num_computed_tokens,
    "boundary written": lambda sim, r: r.num_computed_tokens >= 12 * BS,
}
# trtllm-pp's loop runs a round in one exchange and plans what it admitted in the same iteration
CASES = [
    (policy, phase)
    for policy in ("wavepp", "static", "lockstep", "trtllm-pp")
    for phase in PHASES
    if policy != "trtllm-pp" or phase not in ("in its round", "admitted")
]


@pytest.mark.parametrize("policy, phase", CASES)
def test_an_owner_aborted_at_every_phase_leaves_followers_correct(policy, phase):
    """Waves of 8 tokens behind a long unrelated prompt, so the owner of group 0 computes its
    15 shared blocks over several waves while its followers lease the snapshot at block 12 it
    has not written. Aborted before its chunk that writes that snapshot is dispatched, the
    followers go back to waiting (and one of them computes the prefix); aborted after, they
    resume from it. Either way every follower finishes, resumes from the right state, and
    every stage ends clean."""
    prompts = grouped_prompts(2, 4, 60, 9, seed=3)
    pcfg = PlannerConfig(
        block_size=BS,
        num_stages=2,
        static_wave_tokens=8,
        max_wave_tokens=16,
        min_wave_tokens=8,
        snapshot_interval_blocks=4,
    )
    sim = hybrid_sim(policy, 2, planner_config=pcfg, round_latency_s=1e-4)
    states = StateModel(sim, {**dict(enumerate(prompts)), 100: [7] * 200})
    sim.submit(100, [7] * 200)  # its round is under way when the groups arrive
    for i, p in enumerate(prompts):
        sim.submit(i, p, at=1e-5)
    fired = []

    def maybe_abort():
        sim._check_all()  # every stage's integrity after every event
        owner = sim.leader.requests.get(0)
        if not fired and owner is not None and PHASES[phase](sim, owner):
            fired.append(_followers(sim))
            sim.abort(0)

    sim.loop.run(after_event=maybe_abort)
    assert fired, f"the owner never reached the phase {phase!r}"
    assert sim.records[0].failure == "aborted"
    assert all(sim.records[i].failure is None for i in [*range(1, 8), 100])
    # group 0's followers: one computes the prefix if the owner left before writing the snapshot
    cached = sorted(sim.records[i].num_cached_tokens for i in (2, 4, 6))
    assert cached == ([48, 48, 48] if phase.startswith("boundary") else [0, 48, 48]), cached
    assert states.num_resumed >= 2 * 5
    assert_drained(sim)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(["wavepp", "lockstep", "static"]),
    abort_rate=st.sampled_from([0.05, 0.2]),
    interval=st.sampled_from([1, 2, 3]),
)
def test_random_aborts_with_pending_snapshots(seed, policy, abort_rate, interval):
    """Aborts at random events among bursts sharing prefixes, with resubmissions of the aborted
    prompts, on stages of different sizes: every request ends once, every resume reads its own
    state, every stage ends clean."""
    rng = random.Random(seed)
    prompts = grouped_prompts(3, 6, prefix_len=rng.choice([22, 24, 30]), suffix_len=7, seed=seed)
    pcfg = PlannerConfig(
        block_size=BS,
        num_stages=2,
        static_wave_tokens=12,
        max_wave_tokens=24,
        min_wave_tokens=8,
        snapshot_interval_blocks=interval,
    )
    sim = hybrid_sim(
        policy,
        2,
        interval=interval,
        stage_num_blocks=(90, 120),
        planner_config=pcfg,
        round_latency_s=2e-4,
    )
    all_prompts = dict(enumerate(prompts))
    StateModel(sim, all_prompts)
    ended: dict[int, int] = {}
    sim.on_finish = lambda rid, now: ended.__setitem__(rid, ended.get(rid, 0) + 1)
    for i, p in enumerate(prompts):
        sim.submit(i, p, at=(i // 6) * 1e-3)
    next_id = 1000

    def maybe_abort():
        nonlocal next_id
        sim._check_all()  # every stage's integrity after every event
        live = [rid for rid in sim.leader.requests if rid < 1000]
        if live and rng.random() < abort_rate:
            rid = rng.choice(live)
            sim.abort(rid)
            all_prompts[next_id] = prompts[rid]
            sim.submit(next_id, prompts[rid])
            next_id += 1

    sim.loop.run(after_event=maybe_abort)
    assert len(ended) == len(all_prompts) and set(ended.values()) == {1}
    assert all(sim.records[rid].failure is None for rid in all_prompts if rid >= 1000)
    assert_drained(sim)


def test_a_request_waits_for_the_round_only_to_reach_a_snapshot():
    """Blocks [k, ...) computed by an earlier request of the round: on a dense model the
    request waits to lease them; on a hybrid one only if they reach a boundary the earlier
    request will save (a grid point, or its last reusable boundary)."""
    tokens = list(range(41))  # 10 full blocks, 10 reusable
    req = Request.create(0, tokens, BS)
    h = req.block_hashes
    assert waits_for_round(req, 0, set(h[:3]), set(), BS, 0)  # dense: any shared block
    assert not waits_for_round(req, 0, set(h[:3]), set(), BS, 4)  # blocks 0-2: no grid point
    assert waits_for_round(req, 0, set(h[:4]), set(), BS, 4)  # reaches the grid point 4
    assert waits_for_round(req, 0, set(h[:3]), {h[2]}, BS, 4)  # the earlier request ends at 3
    assert not waits_for_round(req, 4, set(h[:7]), set(), BS, 4)  # from 4 on: 5-7, no 8
    assert not waits_for_round(
        req, 0, set(h[1:4]), set(), BS, 4
    )  # block 0 is not computed in the round
