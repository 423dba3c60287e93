"""Rank 0's side of the Mooncake transport, a `HandoffBackend` (kv_transfer/interfaces.py) driven
by rank 0's hand-off (handoff.py): the stages hold their parts in arenas of their own and
free them themselves (released by the decode side, TTL, room; ledger.py). Rank 0 keeps, per
transfer it opened, the prompt's digest and each stage's location as the stages report them
(until the TTL passes, or more transfers than an arena has entries were opened since: the
stages hold none older), so the answer carries them and a transfer given up (the decode side
failed, the request did) is released on every stage: rank 0 writes the release word through
stage 0's transfer engine (`client`, an ArenaWriter, set by `attach`). It also reads each
stage's arena header (entries, bytes held) on every sweep, for /metrics.

Every method but `open`, `note`, `answer_fields` and `owns` runs on the hand-off's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from wavepp.kv_transfer.mooncake.engine import TransferFailed
from wavepp.kv_transfer.mooncake.ledger import DEFAULT_MAX_ENTRIES
from wavepp.kv_transfer.mooncake.part import prompt_digest
from wavepp.kv_transfer.usage import ArenaUsage, HandoffUsage

log = logging.getLogger(__name__)


@dataclass
class _Opened:
    since: float
    digest: str
    stages: dict[int, dict] = field(default_factory=dict)  # stage -> location


class ArenaBackend:
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
        self.client = None  # stage 0's ArenaWriter (`attach`, at the engine's start)
        self._client_lock = threading.Lock()  # held while the client is used; `detach` waits
        self._lock = threading.Lock()
        self._opened: OrderedDict[str, _Opened] = OrderedDict()  # oldest first
        self._tables: dict[int, dict] = {}  # stage -> its latest location (session, table)
        self._usage: dict[int, ArenaUsage] = {}  # stage -> its arena, at the last sweep
        self._unreachable: set[str] = set()  # sessions whose arena could not be read, logged once

    root = None

    def attach(self, client) -> None:
        self.client = client

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
                "transport": "mooncake",
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

    def usage(self) -> HandoffUsage:
        with self._lock:
            return HandoffUsage(arenas=dict(sorted(self._usage.items())))

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
