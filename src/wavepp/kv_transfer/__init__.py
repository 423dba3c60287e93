"""KV hand-off to a decode engine: each stage writes its own layers' KV of a request that asks
for it (`export.py`), into a store the decode side reads (`directory_store.py`: a local
directory); rank 0's side of it is `handoff.py` (opening, answering, dropping, the stage
reports and the store's bounds)."""

from wavepp.kv_transfer.directory_store import (
    DirectoryStore,
    StagePart,
    Transfer,
    TransferError,
    check_transfer_id,
)

__all__ = ["DirectoryStore", "StagePart", "Transfer", "TransferError", "check_transfer_id"]
