"""The directory store alone: completeness, checksums, ids, TTL and the size cap."""

from __future__ import annotations

import os

import pytest

from wavepp.kv_transfer.directory import DirectoryStore, TransferError


def request(num_stages=2, owner="a"):
    return {"token_ids": [1, 2, 3], "num_stages": num_stages, "block_size": 4, "owner": owner}


def make(store, transfer_id, parts=2, size=100, owner="a"):
    store.write_request(transfer_id, request(2, owner))
    for stage in range(parts):
        store.write_part(transfer_id, stage, bytes([stage]) * size, {"num_tokens": 3})


def reason(store, transfer_id):
    with pytest.raises(TransferError) as err:
        store.read(transfer_id)
    return err.value.reason


def test_complete_incomplete_missing_corrupt(tmp_path):
    store = DirectoryStore(tmp_path)
    assert reason(store, "nothing") == "missing"
    make(store, "t1", parts=1)
    assert reason(store, "t1") == "incomplete"  # stage 1 has not written yet
    store.write_part("t1", 1, b"x" * 10, {"num_tokens": 3})
    transfer = store.read("t1")
    assert [p.stage_id for p in transfer.parts] == [0, 1] and transfer.token_ids == [1, 2, 3]
    assert (
        transfer.parts[1].manifest["bytes"] == 10
        and transfer.parts[1].path.read_bytes() == b"x" * 10
    )
    transfer.parts[0].path.write_bytes(b"\x00" * 99 + b"\x01")
    assert reason(store, "t1") == "corrupt"
    assert not [f for f in (tmp_path / "t1").iterdir() if f.name.endswith(".tmp")]


def test_a_part_for_a_dropped_transfer_is_refused(tmp_path):
    store = DirectoryStore(tmp_path)
    with pytest.raises(TransferError) as err:
        store.write_part("gone", 0, b"x", {})
    assert err.value.reason == "missing" and not (tmp_path / "gone").exists()


@pytest.mark.parametrize("bad", ["", "../x", ".x", "-x", "a/b", "x" * 129, None, 3])
def test_ids_cannot_name_another_path(tmp_path, bad):
    with pytest.raises(ValueError, match="transfer id"):
        DirectoryStore(tmp_path).write_request(bad, request())


def test_taken_id_is_refused(tmp_path):
    store = DirectoryStore(tmp_path)
    store.write_request("t", request())
    with pytest.raises(FileExistsError):
        store.write_request("t", request())


def test_ttl_then_size_cap_oldest_first(tmp_path):
    store = DirectoryStore(tmp_path, ttl_s=100)
    for i, name in enumerate(["old", "mid", "new", "newest"]):
        make(store, name, size=100)
        stamp = 1000 + 10 * i
        (tmp_path / name / ".wavepp-transfer").write_text(str(stamp * 10**9))  # its creation time
    per_transfer = store.total_bytes() // 4  # request.json, two parts, two manifests
    assert store.total_bytes() == 4 * per_transfer
    store.max_bytes = 2 * per_transfer
    # at 1,105 "old" (created at 1,000) is past the TTL; then the cap takes "mid", the oldest left
    assert store.sweep(now=1105) == ["old", "mid"]
    assert store.total_bytes() == 2 * per_transfer
    # at 1,125 "new" (1,020) is past the TTL too; "newest" (1,030) is not
    assert store.sweep(now=1125) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["newest"]


def test_remove_owned_leaves_the_others(tmp_path):
    store = DirectoryStore(tmp_path)
    make(store, "mine", owner="me")
    make(store, "theirs", owner="them")
    assert store.remove_owned("me") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["theirs"]


def test_a_writer_killed_mid_part_leaves_a_transfer_that_reads_incomplete(tmp_path):
    """What a stage killed during its export can leave: a half-written temporary file, or the
    tensors without their manifest. Neither is ever read as a part."""
    store = DirectoryStore(tmp_path)
    make(store, "t", parts=1)
    (tmp_path / "t" / ".stage1.safetensors.123.tmp").write_bytes(b"half")
    assert reason(store, "t") == "incomplete"
    (tmp_path / "t" / "stage1.safetensors").write_bytes(b"all of it, but no manifest")
    assert reason(store, "t") == "incomplete"
    store.write_part("t", 1, b"x" * 100, {"num_tokens": 3})  # a retry, or the real writer
    assert [p.stage_id for p in store.read("t").parts] == [0, 1]


def test_a_failed_transfer_is_refused_with_its_reason_and_its_parts_dropped(tmp_path):
    """A stage that could not write its part: rank 0 records it, the parts other stages wrote
    go, and the transfer reads as failed (never complete, never waited for)."""
    store = DirectoryStore(tmp_path)
    make(store, "t", parts=1)
    store.mark_failed("t", {1: "No space left on device"})
    with pytest.raises(TransferError) as err:
        store.read("t")
    assert (
        err.value.reason == "failed"
        and "stage 1 could not write its part: No space left" in str(err.value)
    )
    assert sorted(f.name for f in (tmp_path / "t").iterdir()) == [
        ".wavepp-transfer",
        "failed.json",
        "request.json",
    ]
    store.write_part("t", 1, b"x", {"num_tokens": 3})  # a late part changes nothing
    assert reason(store, "t") == "failed"
    store.mark_failed("gone", {0: "whatever"})  # a folder already dropped stays dropped
    assert not (tmp_path / "gone").exists()
    assert store.remove("t") and store.total_bytes() == 0


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path):
    store = DirectoryStore(tmp_path)
    make(store, "t", parts=1)
    (tmp_path / "t" / "stage1.safetensors").mkdir()  # the rename onto it fails
    with pytest.raises(OSError):
        store.write_part("t", 1, b"x" * 10, {"num_tokens": 3})
    assert [f.name for f in (tmp_path / "t").iterdir() if f.name.endswith(".tmp")] == []
    assert reason(store, "t") == "incomplete"


def _others(root):
    """What a user keeps beside the store: an old folder with a file, one named like a transfer
    (even with a request.json in it), a loose file, and a link named like a transfer that
    points at a folder carrying the store's mark."""
    (root / "my-notes").mkdir()
    (root / "my-notes" / "todo.txt").write_text("keep me")
    (root / "wpp-lookalike").mkdir()
    (root / "wpp-lookalike" / "request.json").write_text('{"num_stages": 1, "owner": "a"}')
    (root / "notes.txt").write_text("keep me too")
    target = root.parent / f"{root.name}-elsewhere"
    target.mkdir()
    (target / ".wavepp-transfer").touch()
    (target / "request.json").write_text('{"num_stages": 1, "owner": "a"}')
    (root / "linked").symlink_to(target)
    for p in (root / "my-notes", root / "wpp-lookalike", root / "notes.txt"):
        os.utime(p, (1000, 1000))
    return {
        p: p.read_text()
        for p in [
            root / "my-notes" / "todo.txt",
            root / "wpp-lookalike" / "request.json",
            root / "notes.txt",
            target / "request.json",
        ]
    }


def test_folders_and_files_the_store_did_not_make_are_never_touched(tmp_path):
    root = tmp_path / "home"
    root.mkdir()
    kept = _others(root)
    store = DirectoryStore(root, ttl_s=1, max_bytes=1)  # everything past the TTL and the cap
    make(store, "t1", owner="a")
    assert store.total_bytes() > 0 and [e[0] for e in store._entries()] == ["t1"]
    assert store.sweep(now=10**10) == ["t1"]
    assert store.remove_owned("a") == 0
    for name in ("my-notes", "wpp-lookalike", "linked"):
        assert not store.remove(name)
        assert reason(store, name) == "missing"
        with pytest.raises(TransferError):
            store.write_part(name, 0, b"x", {})
        store.mark_failed(name, {0: "x"})
    assert {p: p.read_text() for p in kept} == kept
    assert sorted(p.name for p in root.iterdir()) == [
        "linked",
        "my-notes",
        "notes.txt",
        "wpp-lookalike",
    ]
    assert sorted(p.name for p in (root / "my-notes").iterdir()) == ["todo.txt"]


def test_a_transfer_folder_keeps_files_the_store_did_not_write(tmp_path):
    store = DirectoryStore(tmp_path)
    make(store, "t")
    (tmp_path / "t" / "mine.txt").write_text("not the store's")
    assert store.remove("t")
    assert [p.name for p in (tmp_path / "t").iterdir()] == ["mine.txt"]
    assert store.total_bytes() == 0 and not store.remove("t")  # no longer a transfer


def test_a_request_the_disk_cannot_take_leaves_no_folder(tmp_path, monkeypatch):
    import errno

    from wavepp.kv_transfer.directory import store as store_module

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    store = DirectoryStore(tmp_path)
    monkeypatch.setattr(store_module, "_write_atomic", full)
    with pytest.raises(OSError, match="No space left"):
        store.write_request("t", request())
    assert list(tmp_path.iterdir()) == []


def test_the_cap_orders_by_the_marks_time_and_spares_a_transfer_being_made(tmp_path):
    """Files' mtimes are as coarse as the kernel's tick: two transfers made within one tick have
    the same. The cap goes by the time in the mark, so the newer is kept whatever the listing's
    order; and a transfer still being made (its request.json not written yet) is not dropped."""
    store = DirectoryStore(tmp_path, max_bytes=1)
    for name in ("b-newer", "a-older"):
        make(store, name)
        os.utime(tmp_path / name / "request.json", (5000, 5000))
    (tmp_path / "a-older" / ".wavepp-transfer").write_text(str(1000 * 10**9))
    (tmp_path / "b-newer" / ".wavepp-transfer").write_text(str(2000 * 10**9))
    making = tmp_path / "c-making"
    making.mkdir()
    (making / ".wavepp-transfer").write_text(str(1500 * 10**9))
    assert store.sweep(now=2001) == ["a-older"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b-newer", "c-making"]
