"""Rank 0's side of the hand-off alone: the sweeper enforces the TTL with no traffic, the size
cap has a default, drops are queued and only for this engine's transfers, close removes ours."""

from __future__ import annotations

import shutil
import time

import pytest

from tests.eventually import eventually
from wavepp.kv_transfer.directory import DirectoryStore, TransferError
from wavepp.kv_transfer.directory.backend import DEFAULT_FREE_FRACTION
from wavepp.kv_transfer.handoff import KVHandoff

META = {"num_stages": 1, "block_size": 4}


def test_the_ttl_holds_with_no_traffic(tmp_path):
    handoff = KVHandoff(tmp_path, ttl_s=0.4)
    assert handoff.sweep_interval_s == pytest.approx(0.1)
    handoff.start()
    try:
        transfer_id = handoff.open([1, 2, 3], True, META)
        opened = time.monotonic()
        assert (tmp_path / transfer_id).is_dir()
        assert eventually(lambda: not (tmp_path / transfer_id).exists())
        # gone within TTL + one interval (and a margin for a busy machine), not at the next hand-off
        assert time.monotonic() - opened < 0.4 + 0.1 + 1.0
        assert handoff.num_swept == 1
    finally:
        handoff.close()


def test_the_default_cap_is_a_fraction_of_the_free_space(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    cap = KVHandoff(tmp_path / "not-yet" / "made").store.max_bytes
    assert cap == pytest.approx(free * DEFAULT_FREE_FRACTION, rel=0.05)
    assert KVHandoff(tmp_path, max_bytes=123).store.max_bytes == 123


def test_drop_is_for_this_engines_transfers_only_and_runs_on_the_sweeper(tmp_path):
    ours, theirs = KVHandoff(tmp_path), KVHandoff(tmp_path)
    (tmp_path / "my-notes").mkdir()
    mine, other = ours.open([1, 2], True, META), theirs.open([1, 2], "their-id", META)
    for bad in ("their-id", "my-notes", "../x", "missing"):
        assert not ours.drop(bad)
    assert ours.drop(mine) and (tmp_path / mine).exists()  # queued, not removed in this thread
    ours.start()
    assert eventually(lambda: not (tmp_path / mine).exists())
    assert (tmp_path / other).is_dir() and (tmp_path / "my-notes").is_dir()
    ours.close()
    theirs.close()
    assert [p.name for p in tmp_path.iterdir()] == ["my-notes"]


def test_a_failed_part_is_marked_by_the_sweeper(tmp_path):
    handoff = KVHandoff(tmp_path)
    transfer_id = handoff.open([1, 2], True, META)
    params = handoff.answer(transfer_id, 2, META, {0: "disk full"})
    assert params == {
        "transfer_id": transfer_id,
        "num_tokens": 2,
        **META,
        "error": "stage 0: disk full",
    }
    handoff.start()
    store = DirectoryStore(tmp_path)

    def failed():
        try:
            store.read(transfer_id)
        except TransferError as err:
            return err.reason == "failed"

    assert eventually(failed)
    handoff.close()
    assert list(tmp_path.iterdir()) == []
