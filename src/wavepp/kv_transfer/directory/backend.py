"""Rank 0's side of the directory transport: it writes a transfer's request.json, marks failures,
removes what is given up and sweeps the store by TTL and size cap (store.py). A `HandoffBackend`
(kv_transfer/interfaces.py), driven by rank 0's hand-off (handoff.py).

The size cap: `max_bytes` when given, else DEFAULT_FREE_FRACTION of the space free on the store's
file system when the engine starts (a store that fills its disk fails every hand-off, and
everything else on that disk). Transfers still being written may take the store past it until
the next sweep; the sweeper drops the oldest first.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from wavepp.kv_transfer.directory.store import DirectoryStore
from wavepp.kv_transfer.usage import HandoffUsage

log = logging.getLogger(__name__)

DEFAULT_FREE_FRACTION = 0.5


def default_max_bytes(root: str | Path) -> int:
    """DEFAULT_FREE_FRACTION of the free space of the file system `root` is on (at least 1 MiB)."""
    path = Path(root)
    while not path.exists() and path != path.parent:
        path = path.parent
    return max(2**20, int(shutil.disk_usage(path).free * DEFAULT_FREE_FRACTION))


class DirectoryBackend:
    def __init__(self, root, *, max_bytes: int | None, ttl_s: float):
        """`max_bytes` None: DEFAULT_FREE_FRACTION of the free space under `root` now."""
        cap = default_max_bytes(root) if max_bytes is None else max_bytes
        self.store = DirectoryStore(root, max_bytes=cap, ttl_s=ttl_s)

    @property
    def root(self):
        return self.store.root

    def attach(self, client) -> None:
        return  # rank 0 reaches the store itself

    def open(self, transfer_id: str, token_ids: list[int], meta: dict, owner: str) -> None:
        try:
            self.store.write_request(transfer_id, {"token_ids": token_ids, **meta, "owner": owner})
        except FileExistsError:
            raise ValueError(f"transfer id {transfer_id!r} is in use in the KV store") from None

    def note(self, outcome) -> None:
        return

    def answer_fields(self, transfer_id: str) -> dict:
        return {}

    def owns(self, transfer_id: str, owner: str) -> bool:
        return self.store.owner_of(transfer_id) == owner

    def drop(self, transfer_id: str, owner: str) -> None:
        self.store.remove(transfer_id, owner=owner)

    def fail(self, transfer_id: str, errors: dict) -> None:
        try:
            self.store.mark_failed(transfer_id, errors)
        except OSError as err:
            log.warning(
                "KV transfer %s: its failure could not be recorded in the store: %s",
                transfer_id,
                err,
            )

    def sweep(self) -> int:
        return len(self.store.sweep(time.time()))

    def usage(self) -> HandoffUsage:
        return HandoffUsage(
            store_bytes=self.store.bytes_after_sweep, store_max_bytes=self.store.max_bytes
        )

    def detach(self) -> None:
        return

    def close(self, owner: str) -> None:
        self.store.remove_owned(owner)
