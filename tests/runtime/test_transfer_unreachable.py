"""Mooncake's transfer engine against a peer that stops answering, on a host of the test's own
(tests/netns.py): the engine's connect has no bound of its own, so a new connection to a host
whose link is cut waits on the kernel (here: the host's neighbour entry pinned, as for a host
behind a router, so the kernel never gives up early). TransferEngineHandle bounds it: the call
fails with PeerUnreachable within 2 x its timeout while the engine's call runs on; the buffer it
names is written once the link returns, which is why the callers set it aside (SetAside)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from tests.eventually import eventually
from tests.netns import Network
from wavepp.kv_transfer.mooncake.engine import (
    PeerUnreachable,
    SetAside,
    TransferEngineHandle,
    TransferFailed,
)

pytest.importorskip("mooncake.engine")
pytestmark = pytest.mark.slow

TIMEOUT_S = 2.0
NBYTES = 1 << 20
PEER = """
import sys, time, torch
from wavepp.kv_transfer.mooncake.engine import TransferEngineHandle
engine = TransferEngineHandle.start(sys.argv[1], "tcp", 2.0)
data = torch.arange(1 << 20, dtype=torch.int64).remainder(251).to(torch.uint8)
print(engine.session, engine.register(data), flush=True)
time.sleep(3600)
"""


def _announced(log, host: str) -> tuple[str, int] | None:
    """The peer's "session address" line (its log has the engine's own lines too)."""
    for line in log.read_text().splitlines() if log.exists() else []:
        words = line.split()
        if len(words) == 2 and words[0].startswith(host + ":") and words[1].isdigit():
            return words[0], int(words[1])
    return None


def _pin_neighbour(net: Network, host: str) -> None:
    """The client's neighbour entry for `host` made permanent: with the link cut, a connect
    sends its SYNs into the void, as to a host behind a router that stopped answering."""
    shown = subprocess.run(
        ["ip", "neigh", "show", net.address(host), "dev", net.bridge],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    mac = shown[shown.index("lladdr") + 1]
    subprocess.run(
        ["ip", "neigh", "replace", net.address(host), "lladdr", mac, "nud", "permanent"]
        + ["dev", net.bridge],
        check=True,
    )


def test_a_peer_that_stops_answering_fails_the_call_within_twice_the_timeout(tmp_path):
    with Network(["peer"]) as net:
        log = tmp_path / "peer.log"
        net.start("peer", [sys.executable, "-c", PEER, net.address("peer")], log)
        assert eventually(lambda: _announced(log, net.address("peer")) is not None, timeout_s=60)
        session, remote_addr = _announced(log, net.address("peer"))
        engine = TransferEngineHandle.start(net.client_address, "tcp", TIMEOUT_S)
        expected = torch.arange(NBYTES, dtype=torch.int64).remainder(251).to(torch.uint8)
        buffer = torch.zeros(NBYTES, dtype=torch.uint8)
        local = engine.register(buffer)
        engine.read(session, [(local, remote_addr, NBYTES)])
        assert torch.equal(buffer, expected)
        _pin_neighbour(net, "peer")

        # the connection the engine keeps: the transport's own progress deadline drops it
        net.cut("peer")
        t0 = time.monotonic()
        with pytest.raises(TransferFailed) as failed:
            engine.read(session, [(local, remote_addr, NBYTES)])
        assert not isinstance(failed.value, PeerUnreachable)
        assert time.monotonic() - t0 < TIMEOUT_S + 1.5
        net.restore("peer")
        time.sleep(0.5)

        # a new connection: the engine's connect would wait on the kernel's SYN retries
        net.cut("peer")
        buffer.zero_()
        ticks: list[float] = []
        ticker = threading.Event()

        def tick() -> None:
            while not ticker.wait(0.1):
                ticks.append(time.monotonic())

        threading.Thread(target=tick, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(PeerUnreachable) as unreachable:
            engine.read(session, [(local, remote_addr, NBYTES)])
        took = time.monotonic() - t0
        ticker.set()
        print(f"PeerUnreachable after {took:.1f} s: {unreachable.value}")
        assert 2 * TIMEOUT_S - 0.5 < took < 2 * TIMEOUT_S + 1.5
        assert len(ticks) > 10 * took / 2  # the call waits without the GIL: Python runs on
        assert unreachable.value.host == net.address("peer")
        done = unreachable.value.done
        assert not done.is_set()  # the engine's call runs on

        # a second call to that peer meanwhile fails after one probe, and starts no call
        t0 = time.monotonic()
        with pytest.raises(PeerUnreachable) as again:
            engine.read(session, [(local, remote_addr, NBYTES)])
        assert time.monotonic() - t0 < TIMEOUT_S + 1.0
        assert again.value.done is done

        # the link back: the running call connects and writes the buffer it named, late
        net.restore("peer")
        assert eventually(done.is_set, timeout_s=40)
        assert torch.equal(buffer, expected)
        other = torch.zeros(NBYTES, dtype=torch.uint8)
        engine.read(session, [(engine.register(other), remote_addr, NBYTES)])
        assert torch.equal(other, expected)
        engine.close()


class _Engine:
    def __init__(self):
        self.unregistered: list[torch.Tensor] = []

    def unregister(self, tensor):
        self.unregistered.append(tensor)


def test_set_aside_tensors_are_unregistered_only_once_their_call_returns():
    held, engine = SetAside(), _Engine()
    first, second = threading.Event(), threading.Event()
    a, b, c = torch.zeros(1), torch.zeros(2), torch.zeros(3)
    held.add(first, [a, b])
    held.add(second, [c])
    held.reclaim(engine)
    assert engine.unregistered == [] and len(held) == 2
    second.set()
    held.reclaim(engine)
    assert engine.unregistered == [c] and len(held) == 1
    first.set()
    held.reclaim(engine)
    held.reclaim(engine)
    assert engine.unregistered == [c, a, b] and len(held) == 0
