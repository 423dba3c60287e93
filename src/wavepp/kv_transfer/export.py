"""A stage's side of the hand-off: copy a finished request's KV out of the paged pools, then
hand it to the transport's writer (a `StageWriter`, interfaces.py: the directory store's, or
this stage's arena for Mooncake's transfer engine) on a thread of its own, beside execution.

    stage LOOP:   forward(wave) -> for each chunk that ends a request asking for export:
                      rows = pools.export_rows(block_table, num_tokens)   (a copy, on the host)
                      exporter.submit(transfer_id, rows)                  (returns at once)
                  complete(wave)                                          (blocks may be reused)
    writer:       writer.put(...)   (directory: pack + atomic write; mooncake: into the arena)
                  -> on_outcome(ExportOutcome(request, transfer, stage, error, location))
                  idle: writer.tick(now)   (the arena frees what was released or expired)

The copy is taken before the stage completes the wave, so a block the pool hands to another
request afterwards cannot change what is written. Reused blocks are copied like computed ones:
the decode side needs the whole prompt. A write that fails is logged, counted and reported
(`on_outcome`: the runtime carries it to rank 0, which holds the request's answer until every
stage reported, and says in it which stage failed and why), never raised into the stage: the
prefill's first token does not depend on it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from wavepp.kv_transfer.directory.store import TransferError
from wavepp.kv_transfer.interfaces import StageWriter
from wavepp.kv_transfer.mooncake.engine import TransferFailed
from wavepp.kv_transfer.mooncake.ledger import ArenaFull

log = logging.getLogger(__name__)
_STOP = object()
TICK_S = 0.05  # an idle writer lets its transport free what was released this often


@dataclass(frozen=True)
class ExportOutcome:
    """One stage's part of one request's export: written (error None) or not, and why."""

    request_id: int  # the leader's (internal) id of the request
    transfer_id: str
    stage_id: int
    error: str | None = None
    location: dict | None = None  # where the part lies (the Mooncake transport), for the answer


class StageExporter:
    def __init__(
        self,
        writer: StageWriter,
        stage_id: int,
        manifest: dict,
        *,
        max_pending: int = 256,
        clock=time.monotonic,
    ):
        """`manifest`: what every part of this stage says of itself (model type, layers, dtype,
        block size); each part adds its pools and token count."""
        self.writer = writer
        self.clock = clock
        self.stage_id = stage_id
        self.manifest = {**manifest, "stage_id": stage_id}
        self.num_written = 0
        self.num_failed = 0
        # called on the writer thread after each part, written or failed (the runtime sets it)
        self.on_outcome: Callable[[ExportOutcome], None] = lambda outcome: None
        self._queue: queue.Queue = queue.Queue(max_pending)
        self._thread = threading.Thread(target=self._run, name=f"kv-export-{stage_id}", daemon=True)
        self._thread.start()

    def submit(
        self,
        transfer_id: str,
        rows: dict[str, tuple[list[int], torch.Tensor]],
        num_tokens: int,
        request_id: int = -1,
    ) -> None:
        """Queue one request's rows ({pool: (model layers, [layers, num_tokens, width])});
        `request_id` comes back in its outcome. Blocks only while `max_pending` writes are queued."""
        self._queue.put((transfer_id, rows, num_tokens, request_id))

    def close(self, timeout_s: float = 10.0) -> None:
        """Hand on what is queued, then stop the writer thread and close the writer."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        self.writer.close()

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=TICK_S)
            except queue.Empty:
                self._tick()
                continue
            if item is _STOP:
                return
            transfer_id, rows, num_tokens, request_id = item
            error = location = None
            try:
                location = self.writer.put(transfer_id, rows, num_tokens, self.manifest)
                self.num_written += 1
            except (OSError, TransferError, TransferFailed, ValueError, ArenaFull) as err:
                error = str(err)
            except Exception as err:  # whatever it is, the writer goes on and says so
                error = f"{type(err).__name__}: {err}"
            if error is not None:
                self.num_failed += 1
                log.warning(
                    "stage %d: KV export of %s failed: %s", self.stage_id, transfer_id, error
                )
            try:
                self.on_outcome(
                    ExportOutcome(request_id, transfer_id, self.stage_id, error, location)
                )
            except Exception:  # a report that cannot be made must not stop the writer
                log.exception(
                    "stage %d: the outcome of %s's KV export could not be reported",
                    self.stage_id,
                    transfer_id,
                )

    def _tick(self) -> None:
        try:
            self.writer.tick(self.clock())
        except Exception:  # housekeeping that fails is tried again next tick
            log.exception("stage %d: the KV transport's housekeeping failed", self.stage_id)
