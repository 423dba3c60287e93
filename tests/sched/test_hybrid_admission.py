"""Hybrid models: the leader resumes a request only at a boundary with a snapshot on every stage."""

import random

import pytest

from wavepp.cache import SnapshotPool, hash_blocks
from wavepp.sched.admission import agree_prefix
from wavepp.sched.messages import Hint, ProbeItem, ProbeMsg
from wavepp.sched.request import Request
from wavepp.sched.stage_server import StageServer
from wavepp.sim import build_sim, run_closed_loop

from .conftest import linear_costs

BS = 4


def _request(num_tokens: int) -> Request:
    tokens = list(range(num_tokens))
    return Request(0, tuple(tokens), hash_blocks(tokens, BS))


def test_agreement_is_the_largest_common_snapshot_boundary():
    req = _request(41)  # 10 full blocks, 10 reusable
    a = Hint(0, 10, (), 2, 8, 0)  # grid 2, 4, 6, 8
    b = Hint(0, 10, (), 2, 4, 0)  # a snapshot at 6 was evicted here
    assert agree_prefix(req, [a, b], BS, hybrid=True) == 4  # falls back, never to 6 or 8
    assert agree_prefix(req, [a, a], BS, hybrid=True) == 8
    ends = [Hint(0, 10, (), 4, 8, 10), Hint(0, 10, (), 4, 4, 10)]
    assert agree_prefix(req, ends, BS, hybrid=True) == 10  # the prompt's own end, on both
    assert agree_prefix(req, [a, Hint(0, 3, (), 2, 2, 0)], BS, hybrid=True) == 2
    assert agree_prefix(req, [a, b], BS, hybrid=False) == 10


def test_probe_reports_the_snapshot_grid():
    pool = SnapshotPool(32, BS, num_slots=8, interval_blocks=2)
    server = StageServer(0, pool)
    tokens = list(range(40))
    hashes = tuple(hash_blocks(tokens, BS))
    assert (
        server.probe(ProbeMsg(1, (ProbeItem(7, hashes, 40),))).hints[0].num_grid_snapshot_blocks
        == 0
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_randomized_run_with_snapshot_evictions_never_mismatches(seed):
    """Three stages of different sizes, few snapshot slots: snapshots are evicted all the time,
    the leader falls back to common boundaries, and no stage ever sees a plan it cannot run
    (PlanMismatchError would raise out of the simulator)."""
    rng = random.Random(seed)
    bases = [[rng.randrange(1000) for _ in range(64)] for _ in range(3)]
    prompts = [
        rng.choice(bases)[: rng.randrange(8, 64)]
        + [rng.randrange(1000) for _ in range(rng.randrange(1, 20))]
        for _ in range(60)
    ]
    sim = build_sim(
        "wavepp",
        3,
        linear_costs(),
        stage_num_blocks=[120, 90, 150],
        block_size=BS,
        check_integrity=True,
        hybrid=True,
        snapshot_interval_blocks=2,
    )
    result = run_closed_loop(sim, prompts, concurrency=6)
    assert result.num_failed == 0
    assert 0.2 < result.hit_rate
    for server in sim.servers:
        server.pool.check_integrity()
        assert isinstance(server.pool, SnapshotPool)
        assert server.pool.num_free_slots + server.pool.num_snapshots == server.pool.num_slots
