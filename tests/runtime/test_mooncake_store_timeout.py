"""A store master that takes connections but never answers (its process stopped: what a master
behind a cut link looks like to a client already connected) costs a stage's lookups at most
`timeout_s`, once; then "not held" at once until `retry_s` passed; the store is not called
reachable until a call reaches it again; and the hits come back when the master does."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.eventually import eventually
from wavepp.runtime.mooncake_store import MooncakeStoreClient


def _stopped(pid: int) -> bool:
    """Every thread of `pid` in the stopped state (T)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        states.append(stat[stat.rindex(")") + 2])
    return all(state == "T" for state in states)


def test_an_unanswering_master_costs_one_timeout_then_nothing(mooncake_master):
    client = MooncakeStoreClient(
        mooncake_master.address,
        mooncake_master.metadata,
        segment_bytes=16 << 20,
        buffer_bytes=4 << 20,
        retry_s=1.0,
        timeout_s=1.0,
    )
    try:
        assert client.put(["k"], [b"v" * 512])
        assert client.exists(["k", "missing"]) == [True, False] and client.reachable
        os.kill(mooncake_master.process.pid, signal.SIGSTOP)
        try:
            # every thread stopped before the call (kill only queues the signal: a thread
            # running on the other core answered one more lookup, once)
            assert eventually(lambda: _stopped(mooncake_master.process.pid), timeout_s=5)
            t0 = time.monotonic()
            assert client.exists(["k"]) == [False]
            first = time.monotonic() - t0
            t0 = time.monotonic()
            assert client.get(["k"], 512) == [None]
            assert client.exists(["k"]) == [False]
            after = time.monotonic() - t0
        finally:
            os.kill(mooncake_master.process.pid, signal.SIGCONT)
        assert 0.9 <= first <= 2.0, first  # the timeout, not Mooncake's 30 s RPC timeout
        assert after < 0.1, after  # counted down: no second wait
        assert client.num_timeouts == 1
        time.sleep(1.2)  # past retry_s, with no call since: still not reached
        assert not client.reachable
        # the master answers again: so does the store, after retry_s
        assert eventually(lambda: client.exists(["k"]) == [True], timeout_s=20)
        assert client.reachable
    finally:
        client.close()
