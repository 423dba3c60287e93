"""The hand-off's options (EngineConfig, checked before anything starts) and rank 0's side of
the transfer engine's transport (mooncake/backend.py ArenaBackend), engine-free: what it keeps per
transfer is bounded, what it answers, what it releases."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from wavepp.engine_config import EngineConfig
from wavepp.kv_transfer import TRANSPORTS, get_transport
from wavepp.kv_transfer.directory import DirectoryStore
from wavepp.kv_transfer.directory.writer import DirectoryWriter
from wavepp.kv_transfer.interfaces import HandoffBackend, StageWriter
from wavepp.kv_transfer.mooncake.backend import ArenaBackend
from wavepp.kv_transfer.mooncake.part import prompt_digest
from wavepp.kv_transfer.mooncake.writer import ArenaWriter
from wavepp.kv_transfer.usage import ArenaUsage
from wavepp.runtime.config import RuntimeConfig


@pytest.mark.parametrize(
    "options, needle",
    [
        (dict(kv_transport="mooncake", kv_store="/tmp/x"), "takes none"),
        (dict(kv_transport="directory"), "needs kv_store"),
        (dict(kv_transport="nixl"), "'directory' or 'mooncake'"),
        (dict(kv_transport="mooncake", kv_transport_protocol="udp"), "'tcp' or 'rdma'"),
        (dict(kv_transport="mooncake", kv_arena_gib=0), "kv_arena_gib must be positive"),
        (dict(kv_transport="mooncake", kv_host="no-such-host.invalid"), "not an address"),
    ],
)
def test_bad_hand_off_options_are_refused_before_anything_starts(options, needle):
    with pytest.raises(ValueError, match=needle):
        EngineConfig("smollm2", **options)


def test_which_transport_an_engine_config_names():
    assert EngineConfig("smollm2").handoff_transport == ""
    assert EngineConfig("smollm2", kv_store="/tmp/x").handoff_transport == "directory"
    config = EngineConfig("smollm2", kv_transport="mooncake", kv_host="127.0.0.1")
    assert config.handoff_transport == "mooncake"
    runtime = RuntimeConfig(config, "m", "cpu", "gloo")
    assert (runtime.engine.handoff_transport, runtime.engine.kv_host, runtime.kv_store) == (
        "mooncake",
        "127.0.0.1",
        None,  # no directory store under the Mooncake transport
    )


class FakeClient:
    def __init__(self):
        self.released = []

    def release(self, location):
        self.released.append(location["seq"])

    def arena_header(self, location):
        return ArenaUsage(num_entries=1, num_bytes=10, capacity_bytes=100)


def outcome(transfer_id, stage, seq):
    return SimpleNamespace(
        transfer_id=transfer_id,
        stage_id=stage,
        location={"stage": stage, "seq": seq, "session": f"127.0.0.1:{stage}"},
    )


def test_rank_0_keeps_no_more_transfers_than_an_arena_holds_and_releases_what_it_gives_up():
    now = [0.0]
    backend = ArenaBackend(num_stages=2, ttl_s=10, max_transfers=3, clock=lambda: now[0])
    backend.attach(FakeClient())
    for i in range(5):
        backend.open(f"t{i}", [1, 2, i], {}, "me")
        backend.note(outcome(f"t{i}", 0, 100 + i))
        backend.note(outcome(f"t{i}", 1, 200 + i))
    assert not backend.owns("t1", "me") and backend.owns("t2", "me")  # the oldest forgotten
    with pytest.raises(ValueError, match="in use"):
        backend.open("t4", [1], {}, "me")
    fields = backend.answer_fields("t4")
    assert fields["prompt_digest"] == prompt_digest([1, 2, 4])
    assert [loc["seq"] for loc in fields["stages"]] == [104, 204]
    backend.drop("t3", "me")
    assert backend.client.released == [103, 203] and not backend.owns("t3", "me")
    now[0] = 10.0
    assert backend.sweep() == 2  # t2 and t4 past the TTL: the stages free them themselves
    assert backend.client.released == [103, 203]
    assert backend.usage().arenas == {
        0: ArenaUsage(num_entries=1, num_bytes=10, capacity_bytes=100),
        1: ArenaUsage(num_entries=1, num_bytes=10, capacity_bytes=100),
    }
    backend.detach()
    backend.open("t9", [1], {}, "me")
    backend.note(outcome("t9", 0, 900))
    backend.drop("t9", "me")  # detached (the engine stopping): nothing is written
    assert backend.client is None


def test_the_registry_names_each_transport_and_what_it_needs():
    assert list(TRANSPORTS) == ["directory", "mooncake"]
    directory, mooncake = get_transport("directory"), get_transport("mooncake")
    assert (directory.needs_store, directory.takes_host) == (True, False)
    assert (mooncake.needs_store, mooncake.takes_host) == (False, True)
    with pytest.raises(ValueError, match="must be 'directory' or 'mooncake', got 'nixl'"):
        get_transport("nixl")
    with pytest.raises(ValueError, match="needs a directory"):
        directory.backend(None, num_stages=1, max_bytes=None, ttl_s=1.0)


def test_every_transport_implements_the_declared_interfaces(tmp_path):
    for transport in TRANSPORTS.values():
        backend = transport.backend(tmp_path, num_stages=2, max_bytes=2**20, ttl_s=1.0)
        assert isinstance(backend, HandoffBackend), transport.name
    assert isinstance(DirectoryWriter(DirectoryStore(tmp_path)), StageWriter)
    # an ArenaWriter starts a transfer engine when built: its class is checked instead
    assert all(
        callable(getattr(ArenaWriter, name, None))
        for name in StageWriter.__dict__
        if not name.startswith("_")
    )
