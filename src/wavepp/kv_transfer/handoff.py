"""Rank 0's side of the KV hand-off, one component: it opens a transfer for a request that asks
for one, tracks which stages have reported their parts (reports.py) and answers a request whose
stages stay silent past the deadline, says in the answer which transfer the stages wrote (and,
over Mooncake's transfer engine, where each stage holds its part), drops what is given up, and
keeps the transport's bounds, from a thread of its own. What differs per transport (the
directory store, or the stages' arenas) is its `HandoffBackend` (interfaces.py), which the
registry (transports.py) builds: directory/backend.py, mooncake/backend.py.

    handoff = KVHandoff(root, num_stages=2, export_wait_s=60, max_bytes=None, ttl_s=600)
    transfer_id = handoff.open(token_ids, True, meta)   # request.json written (the caller's thread)
    handoff.expect(request_id)                          # the engine core, at submit
    handoff.start(on_overdue)                           # on_overdue(req, errors): a deadline passed
    handoff.finished(req) / handoff.report(outcome) / handoff.take_errors(request_id)
    params = handoff.answer(transfer_id, num_tokens, meta, errors)   # kv_transfer_params
    handoff.drop_own(transfer_id)                       # given up: removed by the thread
    handoff.close()                                     # the thread stops; our transfers go

Its state is under its own lock, never held while it calls out: the engine core calls it under
the core's lock, and its thread calls `on_overdue` (which takes the core's lock) with none of its
own held. Nothing slow runs in the caller's thread but `open`'s one small file: removals,
failure marks and sweeps are queued to the thread, which wakes at each new transfer, at the
next deadline, and at least every `sweep_interval_s` (a quarter of the TTL, at most 5 s), so a
transfer outlives its TTL by at most that with no traffic at all. The directory store's size
cap (`max_bytes`, by default a fraction of its file system's free space) is its backend's.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from wavepp.kv_transfer.directory.store import check_transfer_id
from wavepp.kv_transfer.reports import ExportReports
from wavepp.kv_transfer.transports import get_transport
from wavepp.kv_transfer.usage import HandoffUsage

log = logging.getLogger(__name__)

MAX_SWEEP_INTERVAL_S = 5.0


class KVHandoff:
    def __init__(
        self,
        root: str | Path | None = None,
        *,
        transport: str = "directory",
        num_stages: int = 1,
        export_wait_s: float = 60.0,
        max_bytes: int | None = None,
        ttl_s: float = 600.0,
        sweep_interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not export_wait_s > 0:
            raise ValueError(
                f"the wait for the stages' KV parts must be positive, got {export_wait_s} s"
            )
        self.backend = get_transport(transport).backend(
            root, num_stages=num_stages, max_bytes=max_bytes, ttl_s=ttl_s, clock=clock
        )
        self.transport = transport
        self.clock = clock
        self._reports = ExportReports(num_stages, export_wait_s)
        self._on_overdue: Callable = lambda req, errors: None
        self.owner = uuid.uuid4().hex
        self.sweep_interval_s = (
            min(MAX_SWEEP_INTERVAL_S, max(0.01, ttl_s / 4))
            if sweep_interval_s is None
            else sweep_interval_s
        )
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str, dict | None]] = []  # ("drop" | "fail", id, errors)
        self._wake = threading.Event()  # something changed: look again now
        self._store_due = threading.Event()  # the store has work: a drop, a mark, a new transfer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.num_swept = 0  # transfers dropped by the TTL or the cap

    @classmethod
    def for_engine(cls, opts, *, hybrid: str | None = None) -> "KVHandoff | None":
        """The hand-off an EngineConfig asks for (None: none); `hybrid`, the model type of a
        hybrid model, which cannot take one yet."""
        if not opts.handoff_transport:
            return None
        if hybrid:
            raise ValueError(
                f"the KV hand-off does not carry recurrent-state snapshots yet: {hybrid} cannot "
                "take kv_store or kv_transport"
            )
        get_transport(opts.handoff_transport).check_installed()  # before a stage is spawned
        gib = opts.kv_store_max_gib
        return cls(
            opts.kv_store,
            transport=opts.handoff_transport,
            num_stages=opts.pp,
            export_wait_s=opts.kv_export_wait_s,
            max_bytes=None if gib is None else int(gib * 2**30),
            ttl_s=opts.kv_ttl_s,
        )

    @property
    def root(self) -> Path | None:
        """The directory store's root (None for the Mooncake transport)."""
        return self.backend.root

    @property
    def store(self):
        """The directory store (the directory transport only)."""
        return self.backend.store

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, on_overdue: Callable | None = None, arena_client=None) -> None:
        """Start the thread; `on_overdue(req, errors)` answers a held request whose deadline
        passed (called with no lock of this component's held). `arena_client`: stage 0's writer
        (in this process); the Mooncake transport releases parts and reads the stages' arenas
        through it."""
        if on_overdue is not None:
            self._on_overdue = on_overdue
        if arena_client is not None:
            self.backend.attach(arena_client)
        self._thread = threading.Thread(target=self._run, name="wavepp-kv-handoff", daemon=True)
        self._thread.start()

    def detach(self) -> None:
        """The engine is about to stop its stages: the hand-off stops using stage 0's transfer
        engine (the Mooncake transport) before it goes."""
        self.backend.detach()

    def close(self) -> None:
        """Stop the thread (what is queued is done first), forget the hand-offs in flight, then
        remove what this engine wrote."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._store_work()
        with self._lock:
            self._reports.clear()
        self.backend.close(self.owner)

    # ---- the stages' reports (the engine core, under its lock) -------------------------------
    def expect(self, request_id: int) -> None:
        """The request (the leader's id) exports: its answer waits for every stage's report."""
        with self._lock:
            self._reports.expect(request_id)

    def finished(self, req) -> bool:
        """The leader finished `req`: True while its answer waits for stage reports (then
        `report` or the deadline answers it); False: answer it now, with `take_errors`."""
        with self._lock:
            held = self._reports.finished(req, self.clock())
        if held:
            self._wake.set()  # its deadline may be the next one
        return held

    def report(self, outcome) -> tuple[object, dict[int, str]] | None:
        """A stage's outcome of one part: counted; the held request it completes, with its
        errors."""
        self.backend.note(outcome)
        with self._lock:
            return self._reports.report(outcome)

    def take_errors(self, request_id: int) -> dict[int, str]:
        """{stage: why} of the request's failed parts; the request is forgotten (also for one
        that never exported, or ended otherwise)."""
        with self._lock:
            return self._reports.take_errors(request_id)

    def counts(self) -> tuple[int, int]:
        """Parts the stages reported since the engine started: (written, failed)."""
        with self._lock:
            return self._reports.num_written, self._reports.num_failed

    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._reports)

    # ---- requests ----------------------------------------------------------------------------
    def open(self, token_ids: list[int], kv_transfer: bool | str, meta: dict) -> str:
        """A new transfer's id, its request.json written (`meta`: model, num_stages, block_size,
        dtype). ValueError for an id that is bad or in use; OSError when the store cannot take
        it (a full disk: nothing is left behind)."""
        if kv_transfer is True:
            transfer_id = f"wpp-{uuid.uuid4().hex}"
        elif isinstance(kv_transfer, str):
            transfer_id = check_transfer_id(kv_transfer)
        else:
            raise ValueError(
                f"kv_transfer must be True or a transfer id (str), got {kv_transfer!r}"
            )
        self.backend.open(transfer_id, token_ids, meta, self.owner)
        self._store_due.set()  # the cap is checked with every new transfer
        self._wake.set()
        return transfer_id

    def answer(
        self, transfer_id: str, num_tokens: int, meta: dict, errors: dict[int, str] | None = None
    ) -> dict:
        """The answer's kv_transfer_params: which transfer, and what a decode engine checks it
        against. With `errors` ({stage: why}) the transfer is marked failed (by the sweeper;
        the decode side refuses params with "error" without reading the store)."""
        params = {
            "transfer_id": transfer_id,
            "num_tokens": num_tokens,
            **meta,
            **self.backend.answer_fields(transfer_id),
        }
        if errors:
            params["error"] = "; ".join(f"stage {stage}: {why}" for stage, why in errors.items())
            self._queue("fail", transfer_id, errors)
        return params

    def drop(self, transfer_id: str) -> bool:
        """Give up a transfer named from outside (the decode side failed): queued for the
        thread. False for an id that is bad, unknown or another engine's (its request.json is
        read here: not for a caller under the engine's lock, see `drop_own`)."""
        try:
            check_transfer_id(transfer_id)
        except ValueError:
            return False
        if not self.backend.owns(transfer_id, self.owner):
            return False
        self.drop_own(transfer_id)
        return True

    def drop_own(self, transfer_id: str) -> None:
        """Give up a transfer this engine opened (its request failed): queued for the thread,
        with no look at the store here (the thread's removal checks the owner itself)."""
        self._queue("drop", transfer_id, None)

    def usage(self) -> HandoffUsage:
        """What /metrics shows, read without scanning: the store's bytes at the last sweep (at
        most a sweep interval old) and its cap, or every stage's arena as read at the last
        sweep; and the transfers the TTL or the cap dropped."""
        return dataclasses.replace(self.backend.usage(), num_swept=self.num_swept)

    # ---- the sweeper -------------------------------------------------------------------------
    def _queue(self, what: str, transfer_id: str, errors: dict | None) -> None:
        with self._lock:
            self._pending.append((what, transfer_id, errors))
        self._store_due.set()
        self._wake.set()

    def _run(self) -> None:
        next_sweep = 0.0
        while not self._stop.is_set():
            self._wake.clear()  # a change from here on wakes the wait below at once
            with self._lock:
                overdue, due = self._reports.expire(self.clock())
            for req, errors in overdue:
                self._on_overdue(req, errors)
            now = self.clock()
            if now >= next_sweep or self._store_due.is_set():
                self._store_due.clear()
                next_sweep = now + self.sweep_interval_s
                try:
                    self._store_work()
                except Exception:  # a store that went away: logged, tried again next time
                    log.exception("KV store sweep failed")
            wait = next_sweep - self.clock()
            if due is not None:
                wait = min(wait, due - self.clock() + 1e-3)
            self._wake.wait(max(0.0, wait))

    def _store_work(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for what, transfer_id, errors in pending:
            if what == "drop":
                self.backend.drop(transfer_id, self.owner)
            else:
                self.backend.fail(transfer_id, errors)
        dropped = self.backend.sweep()
        self.num_swept += dropped
        if dropped:
            log.info("KV hand-off: %d transfer(s) past the TTL or the size cap dropped", dropped)
