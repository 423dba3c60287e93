"""The declared interfaces between the KV hand-off's shared parts and its transports: what a
transport supplies on each side. Both transports (directory/, mooncake/) implement them; the
registry (transports.py) names which classes do.

    stage side    StageWriter      each stage's export writer (export.py) hands its parts to it
    rank 0        HandoffBackend   rank 0's hand-off (handoff.py) opens, answers, gives up,
                                   sweeps and reports through it
    decode side   each transport's reader: the directory store's `read`, or `ArenaPuller`,
                  chosen by the decode plan (decode_plan.py) from the answer's params

Pure: no torch at import (the annotations only name what the sides exchange).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from wavepp.kv_transfer.usage import HandoffUsage


@runtime_checkable
class StageWriter(Protocol):
    """A stage's transport. Called from the stage's one export writer thread, but for `stage`,
    which runs on its compute loop before the wave completes (so a block reused afterwards cannot
    change what is written)."""

    def stage(self, pools, block_table: list[int], num_tokens: int) -> object:
        """The one copy out of the paged pools (host rows, or straight into an arena); never
        raises for a part the transport cannot take (the error is staged for `put`)."""

    def put(self, transfer_id: str, staged, num_tokens: int, manifest: dict) -> dict | None:
        """Hand the staged part on; the location that goes into the answer's params (None: the
        decode side finds it by the transfer id alone). Raises OSError, TransferError,
        TransferFailed, ValueError or ArenaFull for a part not handed on."""

    def tick(self, now: float) -> None:
        """Housekeeping while the writer is idle (an arena frees what was released or expired)."""

    def release(self, location: dict) -> None:
        """Rank 0 gives a part up (the decode side failed)."""

    def close(self) -> None:
        """The stage stops: what the writer holds is let go."""


@runtime_checkable
class HandoffBackend(Protocol):
    """What rank 0's hand-off does per transport. Every method but `open`, `note`,
    `answer_fields` and `owns` runs on the hand-off's thread."""

    root: object  # the directory store's root, or None

    def attach(self, client) -> None:
        """Stage 0's writer, in rank 0's process, through which the stages are reached."""

    def open(self, transfer_id: str, token_ids: list[int], meta: dict, owner: str) -> None:
        """Record a new transfer; ValueError for an id in use, OSError when it cannot be kept."""

    def note(self, outcome) -> None:
        """A stage reported its part (an ExportOutcome)."""

    def answer_fields(self, transfer_id: str) -> dict:
        """What the answer's params add for this transport (where each stage's part lies)."""

    def owns(self, transfer_id: str, owner: str) -> bool: ...

    def drop(self, transfer_id: str, owner: str) -> None:
        """Give a transfer up: removed, or released on every stage."""

    def fail(self, transfer_id: str, errors: dict) -> None:
        """A stage's part failed: the transfer never loads."""

    def sweep(self) -> int:
        """Keep the bounds (TTL, size cap); how many transfers were dropped."""

    def usage(self) -> HandoffUsage:
        """What is held now, read without scanning (num_swept is the hand-off's to fill)."""

    def detach(self) -> None:
        """Stop using stage 0's writer (the stages are stopping); waits for a call in progress."""

    def close(self, owner: str) -> None:
        """Remove, or forget, what this engine wrote."""
