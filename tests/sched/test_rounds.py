"""One admission round, driven by the shared driver: every release a phase produces reaches
every stage, before the next message, whatever the transport."""

from wavepp.cache import BlockPool
from wavepp.sched import (CommitMsg, LeaseMsg, Leader, LeaderConfig, PlannerConfig, ProbeMsg, ReleaseMsg,
                          Request, RequestState, StageServer, make_planner)
from wavepp.sched.rounds import round_messages, run_round

BS = 4


def make(stage_blocks, **pool_kw):
    servers = [StageServer(s, BlockPool(n, BS, **(pool_kw if s == 1 else {})))
               for s, n in enumerate(stage_blocks)]
    leader = Leader(LeaderConfig(len(servers), BS), make_planner("static", PlannerConfig(block_size=BS)))
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


def test_a_request_refused_by_one_stage_is_released_on_every_stage_before_the_commit():
    leader, servers = make([16, 16], max_leased_blocks=0)    # stage 1 leases nothing
    prefix = list(range(1, 9))
    for s in servers:
        cache_prompt(s.pool, 98, prefix + [3])
    leader.add_request(1, prefix + [5])                         # agreed prefix: 2 blocks
    leader.add_request(2, [50, 51, 52])                         # nothing to lease: admitted
    sent, outcome = drive(leader, servers)
    assert [type(m) for m in sent] == [ProbeMsg, LeaseMsg, ReleaseMsg, CommitMsg]
    assert sent[2].request_ids == (1,) and sent[3].request_ids == (2,)
    assert [r.request_id for r in outcome.admitted] == [2]
    assert not held(servers[0], 1) and not held(servers[1], 1)   # stage 0 had leased and escrowed it
    for s in servers:
        s.pool.check_integrity()
    assert leader.requests[1].state == RequestState.WAITING   # retried once a wave has run
    assert run_round(leader, lambda msg: [s.handle(msg) for s in servers], lambda: 0.0) is None


def test_an_abort_during_the_round_is_released_at_its_next_step():
    leader, servers = make([16, 16])
    leader.add_request(1, list(range(1, 12)))
    steps = round_messages(leader, lambda: 0.0)
    probe = next(steps)
    lease = steps.send([s.handle(probe) for s in servers])
    lease_replies = [s.handle(lease) for s in servers]       # both stages leased and escrowed
    assert all(held(s, 1) for s in servers)
    leader.abort(1, 0.0)
    release = steps.send(lease_replies)
    assert isinstance(release, ReleaseMsg) and release.request_ids == (1,)
    for s in servers:
        s.handle(release)
    commit = steps.send(None)
    assert isinstance(commit, CommitMsg) and commit.request_ids == ()
    try:
        steps.send([commit.empty_reply(s.stage_id) for s in servers])
    except StopIteration as stop:
        assert stop.value.admitted == ()
    assert not any(held(s, 1) for s in servers)
    assert [r.state for r in leader.take_finished()] == [RequestState.ABORTED]
