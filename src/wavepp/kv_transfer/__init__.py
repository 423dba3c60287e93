"""KV hand-off to a decode engine: each stage writes its own layers' KV of a request that asks
for it (`export.py`), into a store the decode side reads (`store.py`: a local directory)."""

from wavepp.kv_transfer.store import DirectoryStore, StagePart, Transfer, TransferError, check_transfer_id

__all__ = ["DirectoryStore", "StagePart", "Transfer", "TransferError", "check_transfer_id"]
