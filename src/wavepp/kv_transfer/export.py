"""A stage's side of the hand-off: copy a finished request's KV out of the paged pools, then
write it to the store on a thread of its own, beside execution.

    stage LOOP:   forward(wave) -> for each chunk that ends a request asking for export:
                      rows = pools.export_rows(block_table, num_tokens)   (a copy, on the host)
                      exporter.submit(transfer_id, rows)                  (returns at once)
                  complete(wave)                                          (blocks may be reused)
    writer:       pack as safetensors -> store.write_part (atomic, manifest last)
                  -> on_outcome(ExportOutcome(request, transfer, stage, error or None))

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
from dataclasses import dataclass
from typing import Callable

import torch
from safetensors.torch import save

from wavepp.kv_transfer.directory_store import DirectoryStore, TransferError

log = logging.getLogger(__name__)
_STOP = object()


@dataclass(frozen=True)
class ExportOutcome:
    """One stage's part of one request's export: written (error None) or not, and why."""

    request_id: int  # the leader's (internal) id of the request
    transfer_id: str
    stage_id: int
    error: str | None = None


class StageExporter:
    def __init__(
        self, store: DirectoryStore, stage_id: int, manifest: dict, *, max_pending: int = 256
    ):
        """`manifest`: what every part of this stage says of itself (model type, layers, dtype,
        block size); each part adds its pools, token count and checksum."""
        self.store = store
        self.stage_id = stage_id
        self.manifest = manifest
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
        """Write what is queued, then stop the writer."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            transfer_id, rows, num_tokens, request_id = item
            error = None
            try:
                tensors = {name: t for name, (_, t) in rows.items()}
                pools = {
                    name: {"layers": layers, "width": int(t.shape[-1])}
                    for name, (layers, t) in rows.items()
                }
                data = save(tensors, metadata={"transfer_id": transfer_id})
                self.store.write_part(
                    transfer_id,
                    self.stage_id,
                    data,
                    {**self.manifest, "pools": pools, "num_tokens": num_tokens},
                )
                self.num_written += 1
            except (OSError, TransferError, ValueError) as err:
                error = str(err)
            except Exception as err:  # noqa: BLE001 - whatever it is, the writer goes on and says so
                error = f"{type(err).__name__}: {err}"
            if error is not None:
                self.num_failed += 1
                log.warning(
                    "stage %d: KV export of %s failed: %s", self.stage_id, transfer_id, error
                )
            try:
                self.on_outcome(ExportOutcome(request_id, transfer_id, self.stage_id, error))
            except Exception:  # noqa: BLE001 - a report that cannot be made must not stop the writer
                log.exception(
                    "stage %d: the outcome of %s's KV export could not be reported",
                    self.stage_id,
                    transfer_id,
                )
