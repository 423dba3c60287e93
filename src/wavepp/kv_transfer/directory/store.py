"""The directory store: where each stage leaves its layers' KV of a request for a decode engine.

    <root>/<transfer_id>/
        .wavepp-transfer      the store's mark, made with the folder, holding its creation time
                              (ns): the store reads, sweeps and removes only folders that carry
                              it, whatever their names, and removes only the files it names
                              below (a root shared with other folders and files is safe: they
                              are never touched); the time orders the transfers (a file's mtime
                              is as coarse as the kernel's tick: two transfers may share one)
        request.json          written by rank 0 at submit: the prompt's token ids, the model,
                              the number of stages, the block size, its owner (the engine)
        stage<i>.safetensors  written by stage i after the request's last chunk ran there:
                              one tensor per pool of its layers, [layers, num_tokens, width]
        stage<i>.json         its manifest: the layers, the pools, dtype, token count and the
                              sha256 of the tensor file (written last: a part is complete once
                              its manifest exists)
        failed.json           only where a stage's part failed (rank 0 writes it, then drops
                              the parts): which stage and why; the transfer never loads

Every file is written to a temporary name in the same folder and renamed into place, so a
reader never sees half a file; a stage killed mid-export leaves no manifest, and the transfer
reads as incomplete. A transfer is complete when request.json and every stage's manifest are
there, no failed.json, and every checksum holds (`read`). This module imports no torch: the
tensor files are safetensors, packed by `writer.py` and read by the decode side's connector.

Bounds: `sweep` drops transfers older than the TTL, then the oldest until the store holds at
most `max_bytes`; `remove_owned` drops what one engine wrote (at its shutdown). Who calls them,
and when, is rank 0's hand-off (`handoff.py`, through `backend.py`), from a thread of its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
REQUEST_FILE = "request.json"
FAILED_FILE = "failed.json"
MARKER_FILE = ".wavepp-transfer"
# the files a transfer's folder may hold that the store wrote (the mark apart): removing a
# transfer removes these and nothing else
_NAMES = r"(?:request\.json|failed\.json|stage\d+\.(?:safetensors|json))"
_OWN_FILE = re.compile(rf"^{_NAMES}$|^\.{_NAMES}\.\d+\.tmp$")
log = logging.getLogger(__name__)


class TransferError(Exception):
    """A transfer that cannot be read: `reason` is "missing", "incomplete", "failed" (a stage
    could not write its part: it never completes) or "corrupt"."""

    def __init__(self, transfer_id: str, reason: str, detail: str):
        super().__init__(f"KV transfer {transfer_id!r} is {reason}: {detail}")
        self.transfer_id = transfer_id
        self.reason = reason


def check_transfer_id(transfer_id: str) -> str:
    """A transfer id names a folder: letters, digits, '_', '-', '.', at most 128, not starting
    with a dot (no path can be smuggled in). Raises ValueError naming the rule."""
    if not isinstance(transfer_id, str) or not _ID.match(transfer_id):
        raise ValueError(
            f"transfer id must be 1-128 characters of letters, digits, '_', '-', '.' "
            f"(not starting with '.' or '-'), got {transfer_id!r}"
        )
    return transfer_id


@dataclass(frozen=True)
class StagePart:
    stage_id: int
    manifest: dict
    path: Path  # the tensor file


@dataclass(frozen=True)
class Transfer:
    transfer_id: str
    request: dict  # request.json
    parts: tuple[StagePart, ...]  # by stage id

    @property
    def token_ids(self) -> list[int]:
        return self.request["token_ids"]


class DirectoryStore:
    def __init__(self, root: str | Path, *, max_bytes: int | None = None, ttl_s: float = 600.0):
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"the KV store's size cap must be positive, got {max_bytes} bytes")
        if not ttl_s > 0:
            raise ValueError(f"the KV store's TTL must be positive, got {ttl_s} s")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.bytes_after_sweep = 0  # what the store held after the last sweep
        self.ttl_s = ttl_s
        self.root.mkdir(parents=True, exist_ok=True)

    def folder(self, transfer_id: str) -> Path:
        return self.root / check_transfer_id(transfer_id)

    # ---- writers -----------------------------------------------------------------------------
    def write_request(self, transfer_id: str, request: dict) -> None:
        """Create the transfer's folder with its request.json (rank 0, at submit). Raises
        FileExistsError if the id is taken."""
        folder = self.folder(transfer_id)
        folder.mkdir(parents=True, exist_ok=False)
        try:
            with open(folder / MARKER_FILE, "x") as f:
                f.write(str(time.time_ns()))
            _write_atomic(folder / REQUEST_FILE, json.dumps(request).encode())
        except BaseException:  # a full disk, say: no folder left behind
            _remove_folder(folder)
            raise

    def write_part(self, transfer_id: str, stage_id: int, data: bytes, manifest: dict) -> None:
        """Stage `stage_id`'s tensors (safetensors bytes) and its manifest; the manifest goes
        last, with the data's sha256. A transfer whose folder is gone (dropped, or never
        created) raises TransferError("missing")."""
        folder = self.folder(transfer_id)
        if not is_transfer(folder):
            raise TransferError(
                transfer_id, "missing", f"no transfer {transfer_id} (dropped or never created)"
            )
        name = f"stage{stage_id}.safetensors"
        _write_atomic(folder / name, data)
        manifest = {
            **manifest,
            "stage_id": stage_id,
            "file": name,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        _write_atomic(folder / f"stage{stage_id}.json", json.dumps(manifest).encode())

    def mark_failed(self, transfer_id: str, errors: dict[int, str]) -> None:
        """A stage could not write its part ({stage id: why}): record it (failed.json, which
        `read` refuses) and drop the parts written, so the transfer is never read as part of a
        prompt. A folder already gone is left gone; OSError when the folder cannot be written."""
        folder = self.folder(transfer_id)
        if not is_transfer(folder):
            return
        _write_atomic(
            folder / FAILED_FILE,
            json.dumps({"stages": {str(s): e for s, e in errors.items()}}).encode(),
        )
        for f in folder.glob("stage*"):
            if _OWN_FILE.match(f.name) and f.is_file():
                f.unlink(missing_ok=True)

    # ---- readers -----------------------------------------------------------------------------
    def read(self, transfer_id: str, *, verify: bool = True) -> Transfer:
        """The complete transfer, every part's checksum checked (`verify`). Raises
        TransferError: missing (no folder or no request.json), incomplete (a stage's manifest
        is not there yet), failed (a stage reported its part failed: it never will be),
        corrupt (a checksum or a manifest that fails)."""
        folder = self.folder(transfer_id)
        if not is_transfer(folder):
            raise TransferError(transfer_id, "missing", f"no transfer {transfer_id} in the store")
        try:
            request = json.loads((folder / REQUEST_FILE).read_bytes())
        except FileNotFoundError:
            raise TransferError(
                transfer_id, "missing", f"{transfer_id} has no {REQUEST_FILE}"
            ) from None
        except (OSError, ValueError) as err:
            raise TransferError(transfer_id, "corrupt", f"{REQUEST_FILE}: {err}") from None
        try:
            failed = json.loads((folder / FAILED_FILE).read_bytes()).get("stages", {})
        except FileNotFoundError:
            failed = None
        except (OSError, ValueError) as err:
            failed = {"?": f"{FAILED_FILE}: {err}"}
        if failed is not None:
            detail = "; ".join(
                f"stage {s} could not write its part: {e}" for s, e in failed.items()
            )
            raise TransferError(transfer_id, "failed", detail or "a stage could not write its part")
        parts = []
        for stage_id in range(int(request["num_stages"])):
            try:
                manifest = json.loads((folder / f"stage{stage_id}.json").read_bytes())
            except FileNotFoundError:
                raise TransferError(
                    transfer_id, "incomplete", f"stage {stage_id} has not written its part"
                ) from None
            except (OSError, ValueError) as err:
                raise TransferError(
                    transfer_id, "corrupt", f"stage {stage_id}'s manifest: {err}"
                ) from None
            path = folder / manifest["file"]
            if verify:
                try:
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                except OSError as err:
                    raise TransferError(
                        transfer_id, "corrupt", f"stage {stage_id}'s tensors: {err}"
                    ) from None
                if digest != manifest["sha256"]:
                    raise TransferError(
                        transfer_id, "corrupt", f"stage {stage_id}'s tensors fail their checksum"
                    )
            parts.append(StagePart(stage_id, manifest, path))
        return Transfer(transfer_id, request, tuple(parts))

    def remove(self, transfer_id: str, *, owner: str | None = None) -> bool:
        """Drop a transfer (taken by the decode side, or given up): its files, then its folder.
        Only a folder the store made is touched; with `owner`, only one that owner wrote. True
        if it was there."""
        folder = self.folder(transfer_id)
        if not is_transfer(folder) or (owner is not None and self.owner_of(transfer_id) != owner):
            return False
        _remove_folder(folder)
        return True

    def owner_of(self, transfer_id: str) -> str | None:
        """The engine that wrote the transfer (its request.json's owner), or None."""
        try:
            return json.loads((self.folder(transfer_id) / REQUEST_FILE).read_bytes()).get("owner")
        except (OSError, ValueError, AttributeError):
            return None

    # ---- bounds ------------------------------------------------------------------------------
    def sweep(self, now: float | None = None) -> list[str]:
        """Drop transfers older than the TTL, then the oldest until the store holds at most
        max_bytes; the cap never takes the newest (a cap below one transfer keeps one), nor one
        still being created (no request.json yet). Returns the ids dropped, oldest first."""
        now = time.time() if now is None else now
        entries = sorted(self._entries(), key=lambda e: e[1])  # (id, created, bytes), oldest first
        dropped, total = [], sum(size for _, _, size in entries)
        for i, (transfer_id, created, size) in enumerate(entries):
            over = (
                self.max_bytes is not None
                and total > self.max_bytes
                and i < len(entries) - 1
                and (self.root / transfer_id / REQUEST_FILE).exists()
            )
            if now - created > self.ttl_s or over:
                self.remove(transfer_id)
                dropped.append(transfer_id)
                total -= size
        self.bytes_after_sweep = total
        return dropped

    def remove_owned(self, owner: str) -> int:
        """Drop every transfer whose request.json names `owner`. Returns how many."""
        return sum(
            self.remove(transfer_id, owner=owner) for transfer_id, _, _ in list(self._entries())
        )

    def total_bytes(self) -> int:
        return sum(size for _, _, size in self._entries())

    def _entries(self):
        """(id, created, bytes) of every transfer the store made; other folders are not looked
        into."""
        try:
            folders = list(self.root.iterdir())
        except FileNotFoundError:
            return
        for folder in folders:
            if not _ID.match(folder.name) or not is_transfer(folder):
                continue
            try:
                created = _created(folder)
                size = sum(f.stat().st_size for f in folder.iterdir() if _OWN_FILE.match(f.name))
            except OSError:  # removed while looked at
                continue
            yield folder.name, created, size


def _created(folder: Path) -> float:
    """When the transfer was made (s since the epoch): the time in its mark, else its mtime."""
    marker = folder / MARKER_FILE
    try:
        return int(marker.read_text()) / 1e9
    except ValueError:
        return marker.stat().st_mtime


def is_transfer(folder: Path) -> bool:
    """A folder the store made: a real folder (not a link) holding the store's mark."""
    try:
        return (
            not folder.is_symlink()
            and folder.is_dir()
            and (folder / MARKER_FILE).is_file()
            and not (folder / MARKER_FILE).is_symlink()
        )
    except OSError:
        return False


def _remove_folder(folder: Path, attempts: int = 3) -> None:
    """The store's files of a transfer, its mark last, then the folder if that left it empty. A
    folder that also holds files the store did not write loses the store's files and mark and
    keeps the rest (logged). A writer racing the removal may add a file between the listing and
    the rmdir: the listing is tried again."""
    for _ in range(attempts):
        try:
            for f in folder.iterdir():
                if _OWN_FILE.match(f.name) and not f.is_dir():
                    f.unlink(missing_ok=True)
            (folder / MARKER_FILE).unlink(missing_ok=True)
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            continue
    others = sorted(f.name for f in folder.iterdir()) if folder.is_dir() else []
    if others:
        log.warning(
            "KV store: %s holds files the store did not write (%s); they are left there",
            folder,
            ", ".join(others[:5]),
        )


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no half file left behind (a full disk, a bad path)
        raise
