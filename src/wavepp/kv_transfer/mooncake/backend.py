"""What rank 0's hand-off (handoff.py) does per transport: open a transfer, say in the answer
where it lies, give it up, keep the bounds, report what is held.

`DirectoryBackend`: rank 0 writes the transfer's request.json, marks failures, removes what is
given up and sweeps the store by TTL and size cap (directory_store.py).

`ArenaBackend` (the Mooncake transport): the stages hold their parts in arenas of their own and
free them themselves (released by the decode side, TTL, room; arena.py). Rank 0 keeps, per
transfer it opened, the prompt's digest and each stage's location as the stages report them
(until the TTL passes, or more transfers than an arena has entries were opened since: the
stages hold none older), so the answer carries them and a transfer given up (the
decode side failed, the request did) is released on every stage: rank 0 writes the release word
through stage 0's transfer engine (`client`, a MooncakeTransport). It also reads each stage's
arena header (entries, bytes held) on every sweep, for /metrics.

Every method but `open`, `note`, `answer_fields` and `owns` runs on the hand-off's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from wavepp.kv_transfer.arena_part import prompt_digest
from wavepp.kv_transfer.directory_store import DirectoryStore
from wavepp.kv_transfer.mooncake_engine import TransferFailed
from wavepp.kv_transfer.transport import DEFAULT_MAX_ENTRIES

log = logging.getLogger(__name__)


class DirectoryBackend:
    kind = "directory"

    def __init__(self, root, *, max_bytes: int, ttl_s: float):
        self.store = DirectoryStore(root, max_bytes=max_bytes, ttl_s=ttl_s)

    @property
    def root(self):
        return self.store.root

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

    def usage(self) -> dict:
        return {"bytes": self.store.bytes_after_sweep, "max_bytes": self.store.max_bytes}

    def detach(self) -> None:
        return

    def close(self, owner: str) -> None:
        self.store.remove_owned(owner)


@dataclass
class _Opened:
    since: float
    digest: str
    stages: dict[int, dict] = field(default_factory=dict)  # stage -> location


class ArenaBackend:
    kind = "mooncake"

    def __init__(
        self,
        *,
        num_stages: int,
        ttl_s: float,
        max_transfers: int = DEFAULT_MAX_ENTRIES,
        clock=time.monotonic,
    ):
        self.num_stages = num_stages
        self.ttl_s = ttl_s
        # no stage's arena holds more parts than its table's entries: a transfer older than the
        # last `max_transfers` opened is gone from every stage, and forgotten here too
        self.max_transfers = max_transfers
        self.clock = clock
        self.client = None  # stage 0's MooncakeTransport (Engine wires it at start)
        self._client_lock = threading.Lock()  # held while the client is used; `detach` waits
        self._lock = threading.Lock()
        self._opened: OrderedDict[str, _Opened] = OrderedDict()  # oldest first
        self._tables: dict[int, dict] = {}  # stage -> its latest location (session, table)
        self._usage: dict[int, dict] = {}  # stage -> {"entries", "bytes", "capacity"}
        self._unreachable: set[str] = set()  # sessions whose arena could not be read, logged once

    root = None

    def open(self, transfer_id: str, token_ids: list[int], meta: dict, owner: str) -> None:
        digest = prompt_digest(token_ids)
        with self._lock:
            if transfer_id in self._opened:
                raise ValueError(f"transfer id {transfer_id!r} is in use")
            self._opened[transfer_id] = _Opened(self.clock(), digest)
            while len(self._opened) > self.max_transfers:
                self._opened.popitem(last=False)

    def note(self, outcome) -> None:
        if outcome.location is None:
            return
        with self._lock:
            self._tables[outcome.stage_id] = outcome.location
            opened = self._opened.get(outcome.transfer_id)
            if opened is not None:
                opened.stages[outcome.stage_id] = outcome.location

    def answer_fields(self, transfer_id: str) -> dict:
        with self._lock:
            opened = self._opened.get(transfer_id)
            if opened is None:
                return {}
            return {
                "transport": self.kind,
                "prompt_digest": opened.digest,
                "stages": [opened.stages.get(s) for s in range(self.num_stages)],
            }

    def owns(self, transfer_id: str, owner: str) -> bool:
        with self._lock:
            return transfer_id in self._opened

    def drop(self, transfer_id: str, owner: str) -> None:
        with self._lock:
            opened = self._opened.pop(transfer_id, None)
        if opened is not None:
            self._release(transfer_id, opened.stages.values())

    def fail(self, transfer_id: str, errors: dict) -> None:
        self.drop(transfer_id, "")  # the parts that were written are of no use: freed now

    def sweep(self) -> int:
        """Forget the transfers past the TTL (their stages free them); read every stage's
        arena header. -> how many were forgotten."""
        now = self.clock()
        with self._lock:
            old = [t for t, o in self._opened.items() if now - o.since >= self.ttl_s]
            for transfer_id in old:
                del self._opened[transfer_id]
            tables = dict(self._tables)
        for stage, location in tables.items():
            with self._client_lock:
                if self.client is None:
                    return len(old)
                try:
                    usage = self.client.arena_header(location)
                    self._unreachable.discard(location["session"])
                except TransferFailed as err:  # the stage is gone: its arena with it
                    if location["session"] not in self._unreachable:
                        self._unreachable.add(location["session"])
                        log.warning("stage %d's KV arena cannot be read: %s", stage, err)
                    usage = None
                with self._lock:
                    if usage is None:
                        self._usage.pop(stage, None)
                    else:
                        self._usage[stage] = usage
        return len(old)

    def usage(self) -> dict:
        with self._lock:
            return {"arenas": {s: dict(u) for s, u in sorted(self._usage.items())}}

    def detach(self) -> None:
        """Stop using stage 0's transfer engine (the engine is shutting its stages down); waits
        for a release or a read in progress."""
        with self._client_lock:
            self.client = None

    def close(self, owner: str) -> None:
        """Forget every transfer: the arenas went with their stage processes."""
        with self._lock:
            self._opened.clear()
            self._usage.clear()

    def _release(self, transfer_id: str, locations) -> None:
        for location in locations:
            with self._client_lock:
                if self.client is None:
                    return
                try:
                    self.client.release(location)
                except TransferFailed as err:
                    log.warning(
                        "KV transfer %s: stage %s's part could not be released (%s); its TTL "
                        "frees it",
                        transfer_id,
                        location.get("stage"),
                        err,
                    )
