"""Helpers of the runtime tests (the tiny model of conftest.py)."""

VOCAB = 256
MAX_POSITIONS = 512  # of the tiny model (conftest.py)


def groups(rng, num_groups=8, prefix_len=96):
    return [[rng.randrange(VOCAB) for _ in range(prefix_len)] for _ in range(num_groups)]


def assert_clean(engine):
    for cap, live in engine.check_integrity():
        assert (
            live == 0
            and cap.num_leased == cap.num_escrowed == cap.num_pending == cap.num_in_use == 0
        )
    leader = engine._core.leader
    assert leader.state_size() == 0 and engine._core.num_live_requests == 0
