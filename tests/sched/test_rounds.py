"""One admission round, driven by the shared driver: two exchanges (probe; lease with escrow
and commit), and every release a phase produces reaches every stage before the round ends,
whatever the transport."""

from wavepp.cache import BlockPool
from wavepp.sched import (
    Leader,
    LeaderConfig,
    LeaseItem,
    LeaseMsg,
    PlannerConfig,
    ProbeItem,
    ProbeMsg,
    ReleaseMsg,
    Request,
    RequestState,
    StageServer,
    make_planner,
)
from wavepp.sched.rounds import round_messages, run_round

BS = 4


def make(stage_blocks, **pool_kw):
    servers = [
        StageServer(s, BlockPool(n, BS, **(pool_kw if s == 1 else {})))
        for s, n in enumerate(stage_blocks)
    ]
    leader = Leader(
        LeaderConfig(len(servers), BS), make_planner("static", PlannerConfig(block_size=BS))
    )
    return leader, servers


def record(servers, log):
    def exchange(msg):
        log.append(msg)
        replies = [s.handle(msg) for s in servers]
        return None if isinstance(msg, ReleaseMsg) else replies

    return exchange


def held(server, request_id):
    return server.pool.has_request(request_id) or request_id in server.requests


def cache_prompt(pool, request_id, tokens):
    """Leave `tokens` computed and cached in `pool` (its full blocks)."""
    hashes = Request.create(request_id, tokens, BS).block_hashes
    num_blocks = -(-len(tokens) // BS)
    assert pool.lease(request_id, hashes, 0).ok and pool.reserve(request_id, num_blocks).ok
    assert pool.commit(request_id, hashes).ok
    pool.materialize(request_id)
    pool.publish(request_id, len(tokens))
    pool.free(request_id)


def drive(leader, servers):
    """Drive one round over `servers`; the messages every stage got, and the outcome."""
    steps = round_messages(leader, lambda: 0.0)
    sent, msg = [], next(steps)
    try:
        while True:
            sent.append(msg)
            replies = [s.handle(msg) for s in servers]
            msg = steps.send(None if isinstance(msg, ReleaseMsg) else replies)
    except StopIteration as stop:
        return sent, stop.value


def test_a_round_is_two_exchanges_when_every_stage_admits():
    leader, servers = make([16, 16])
    leader.add_request(1, list(range(1, 12)))
    leader.add_request(2, list(range(50, 57)))
    sent, outcome = drive(leader, servers)
    assert [type(m) for m in sent] == [ProbeMsg, LeaseMsg]
    assert [r.request_id for r in outcome.admitted] == [1, 2]
    for s in servers:  # committed at the lease: request 1's two full blocks are pending entries
        assert s.pool.capacity().num_pending == 2 + 1
        assert s.pool.match(leader.requests[1].block_hashes).num_blocks == 2
        s.pool.check_integrity()


def test_a_request_refused_by_one_stage_is_released_on_every_stage_before_the_round_ends():
    leader, servers = make([16, 16], max_leased_blocks=0)  # stage 1 leases nothing
    prefix = list(range(1, 9))
    for s in servers:
        cache_prompt(s.pool, 98, prefix + [3])
    leader.add_request(1, prefix + [5, 6, 7, 8, 9])  # agreed prefix: 2 blocks, 1 new full
    leader.add_request(2, [50, 51, 52])  # nothing to lease: admitted
    sent, outcome = drive(leader, servers)
    assert [type(m) for m in sent] == [ProbeMsg, LeaseMsg, ReleaseMsg]
    assert sent[2].request_ids == (1,)
    assert [r.request_id for r in outcome.admitted] == [2]
    # stage 0 had leased, escrowed and committed it: its pending block left the index again
    assert not held(servers[0], 1) and not held(servers[1], 1)
    hashes = leader.requests[1].block_hashes
    for s in servers:
        assert s.pool.match(hashes).num_blocks == 2
        assert s.pool.capacity().num_pending == 0
        s.pool.check_integrity()
    assert leader.requests[1].state == RequestState.WAITING  # retried once a wave has run
    assert run_round(leader, lambda msg: [s.handle(msg) for s in servers], lambda: 0.0) is None


def test_a_later_lease_may_not_take_the_room_an_earlier_request_committed():
    """Items of a lease are leased, escrowed and committed in order: a later request whose
    prefix is an earlier one's escrow victim gets it only if a replacement is left."""
    server = StageServer(0, BlockPool(4, BS))
    cache_prompt(server.pool, 98, list(range(1, 9)))  # 2 cached blocks, 2 free
    a = Request.create(1, list(range(20, 36)), BS)  # 4 new blocks: the 2 free, then the cached 2
    b = Request.create(2, list(range(1, 13)), BS)  # reuses the 2 cached blocks, 1 new
    probe = server.handle(
        ProbeMsg(
            0, tuple(ProbeItem(r.request_id, tuple(r.block_hashes), r.num_tokens) for r in (a, b))
        )
    )
    assert [h.num_blocks for h in probe.hints] == [0, 2]
    reply = server.handle(LeaseMsg(0, (LeaseItem(1, 0, 4), LeaseItem(2, 2, 1))))
    assert [r.ok for r in reply.results] == [True, False]
    assert "committed" in reply.results[1].reason
    assert not held(server, 2) and server.pool.capacity().num_escrowed == 4
    server.pool.check_integrity()


def test_an_abort_during_the_round_is_released_at_its_next_step():
    leader, servers = make([16, 16])
    leader.add_request(1, list(range(1, 12)))
    steps = round_messages(leader, lambda: 0.0)
    probe = next(steps)
    lease = steps.send([s.handle(probe) for s in servers])
    lease_replies = [s.handle(lease) for s in servers]  # both stages leased, escrowed, committed
    assert all(held(s, 1) for s in servers)
    leader.abort(1, 0.0)
    release = steps.send(lease_replies)
    assert isinstance(release, ReleaseMsg) and release.request_ids == (1,)
    for s in servers:
        s.handle(release)
    try:
        steps.send(None)
        raise AssertionError("the round goes on after its lease")
    except StopIteration as stop:
        assert stop.value.admitted == ()
    assert not any(held(s, 1) for s in servers)
    assert [r.state for r in leader.take_finished()] == [RequestState.ABORTED]
