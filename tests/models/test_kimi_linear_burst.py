"""Kimi-Linear (transformers' own tiny checkpoint, fp32): prompts submitted together share
their prefix's state snapshots while the request computing them is in flight.

32 prompts in 8 groups: 30 shared tokens (7 blocks of 4, and 2 tokens) and 3-10 of their own.
With a snapshot every 4 blocks a follower can resume only at block 4 (16 tokens), the grid
point below its 7 shared blocks: the bound is the shared full blocks rounded down to the grid
(`snapshot_reusable_tokens`), and every follower reaches it though it arrives with its
group's first prompt. First tokens and logprobs are transformers'; after the run (and after
owners are aborted at random moments) every stage's pool checks clean, snapshots included: no
pending block (hence no pending snapshot, which sits on one), no slot leaked or held twice.
"""

from __future__ import annotations

import random
import time

import pytest
import torch

from wavepp.random_checkpoint import make_model
from wavepp.workloads.workload import snapshot_reusable_tokens

BS, INTERVAL = 4, 4
ATOL = 1e-4


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    # layers: KDA, KDA, MLA, KDA (PP = 3 puts a stage of KDA only and one of MLA only)
    return make_model(
        tmp_path_factory.mktemp("kimi") / "kimi", arch="kimi_linear", num_layers=4, seed=3
    )


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(11)
    prefixes = [[rng.randrange(256) for _ in range(30)] for _ in range(8)]
    return [
        prefixes[g] + [rng.randrange(256) for _ in range(rng.randrange(3, 11))]
        for _ in range(4)
        for g in range(8)
    ]


@pytest.fixture(scope="module")
def reference(kimi, prompts):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(kimi, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0, -1].log_softmax(-1) for p in prompts]


def check_tokens(results, reference, indices):
    for i in indices:
        r, lp = results[i], reference[i]
        assert r.ok, (i, r.error)
        assert r.first_token_id == int(lp.argmax()), i
        assert abs(r.first_token_logprob - float(lp.max())) < ATOL, i


def assert_clean(engine):
    for cap, live in engine.check_integrity():
        assert (
            live == 0
            and cap.num_leased == cap.num_escrowed == cap.num_pending == cap.num_in_use == 0
        )


def simulated_cached_tokens(
    prompts, policy: str, num_stages: int, stage_num_blocks: list[int]
) -> list[int]:
    """The same burst through the simulator: the runtime's leader, planner and stage pools."""
    from wavepp.sched.policy import get_policy
    from wavepp.sim import SimCosts, build_sim

    costs = SimCosts(wave_seconds=lambda stage, chunks: 1e-3 + 1e-5 * sum(x for _, x in chunks))
    sim = build_sim(
        policy,
        num_stages,
        costs,
        stage_num_blocks=stage_num_blocks,
        block_size=BS,
        check_integrity=True,
        hybrid=True,
        snapshot_interval_blocks=INTERVAL,
        loop=get_policy(policy).loop,
    )
    for i, p in enumerate(prompts):
        sim.submit(i, p)
    sim.run()
    assert all(r.failure is None for r in sim.records.values())
    return [sim.records[i].num_cached_tokens for i in range(len(prompts))]


@pytest.mark.parametrize("num_stages", [2, 3])
def test_a_burst_reuses_the_ideal_on_the_grid_as_transformers_computes(
    kimi, prompts, reference, num_stages
):
    from wavepp.engine import Engine

    want = snapshot_reusable_tokens(prompts, BS, INTERVAL)
    assert want == [0] * 8 + [16] * 24
    blocks = [200] * num_stages
    with Engine(
        str(kimi),
        pp=num_stages,
        dtype="float32",
        block_size=BS,
        stage_num_blocks=blocks,
        snapshot_interval_blocks=INTERVAL,
        layer_split="even",  # PP = 3: a stage of MLA only and one of KDA only (not auto's)
    ) as engine:
        results = engine.prefill(prompts)
        check_tokens(results, reference, range(32))
        assert [r.num_cached_tokens for r in results] == want
        assert_clean(engine)
    # the simulator's hybrid runs of the same burst get the same hit, request by request
    for policy in ("wavepp", "static", "lockstep", "trtllm-pp", "sglang-pp"):
        assert simulated_cached_tokens(prompts, policy, num_stages, blocks) == want, policy


def test_runtime_and_simulator_agree_on_a_closed_loop(kimi):
    """The bench's reuse workload (8 groups sharing 90% of 64 tokens), 8 outstanding at a
    time: followers arrive while their group's first prompt is computing. The runtime and the
    simulator reuse the same tokens, request by request: the ideal on the grid."""
    from concurrent.futures import FIRST_COMPLETED, wait

    from wavepp.engine import Engine
    from wavepp.sim import SimCosts, build_sim, run_closed_loop
    from wavepp.workloads import make_workload

    work = make_workload(
        "reuse", num_requests=32, num_groups=8, prompt_len=64, block_size=BS, seed=4, vocab_size=256
    )
    want = snapshot_reusable_tokens(work.prompts, BS, INTERVAL)
    assert sum(want) / work.num_tokens > 0.5
    with Engine(
        str(kimi),
        pp=2,
        dtype="float32",
        block_size=BS,
        stage_num_blocks=[200, 200],
        snapshot_interval_blocks=INTERVAL,
    ) as engine:
        futures, pending, next_index = {}, set(), 0
        while next_index < len(work.prompts) or pending:
            while next_index < len(work.prompts) and len(pending) < 8:
                futures[next_index] = engine.submit(work.prompts[next_index])
                pending.add(futures[next_index])
                next_index += 1
            _, pending = wait(pending, return_when=FIRST_COMPLETED)
        results = [futures[i].result() for i in range(len(work.prompts))]
        assert all(r.ok for r in results)
        assert_clean(engine)
    costs = SimCosts(wave_seconds=lambda stage, chunks: 1e-3 + 1e-5 * sum(x for _, x in chunks))
    sim = build_sim(
        "wavepp",
        2,
        costs,
        stage_num_blocks=[200, 200],
        block_size=BS,
        check_integrity=True,
        hybrid=True,
        snapshot_interval_blocks=INTERVAL,
    )
    report = run_closed_loop(sim, work.prompts, concurrency=8)
    assert [r.num_cached_tokens for r in results] == want
    assert [sim.records[i].num_cached_tokens for i in range(32)] == want
    assert report.hit_rate == sum(want) / work.num_tokens


@pytest.mark.parametrize("policy", ["wavepp", "trtllm-pp"])
def test_owners_aborted_at_random_moments_leave_followers_correct(kimi, prompts, reference, policy):
    """The first prompt of each group is aborted, one every few milliseconds from the submit
    on: in a round, admitted, with chunks in flight or done. Every follower finishes with
    transformers' first token, and every stage checks clean; the pipeline then serves the
    same prompts again from its cache."""
    from wavepp.engine import Engine

    rng = random.Random(2)
    with Engine(
        str(kimi),
        pp=2,
        policy=policy,
        dtype="float32",
        block_size=BS,
        stage_num_blocks=[160, 200],
        snapshot_interval_blocks=INTERVAL,
    ) as engine:
        futures = [engine.submit(p) for p in prompts]
        for owner in range(8):
            engine.abort(futures[owner].request_id)
            time.sleep(rng.random() * 0.01)
        results = [f.result(timeout=120) for f in futures]
        assert sum(r.error == "aborted" for r in results[:8]) >= 1
        assert all(r.ok or r.error == "aborted" for r in results[:8])
        check_tokens(results, reference, range(8, 32))
        assert_clean(engine)
        again = engine.prefill(prompts)
        check_tokens(again, reference, range(32))
        assert all(r.num_cached_tokens >= 16 for r in again)
        assert_clean(engine)
