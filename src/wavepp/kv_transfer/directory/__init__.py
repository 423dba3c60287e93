"""The directory transport: every stage writes its part into a store on a file system, which a
decode engine on that file system reads.

    store.py     DirectoryStore: the folders, files and marks; read, sweep, remove (no torch)
    writer.py    the stage side (DirectoryWriter: pack as safetensors, write)
    backend.py   rank 0's side (DirectoryBackend: request.json, failures, the TTL and the cap)
    the decode side reads the store (`DirectoryStore.read`; decode_plan.py `plan_load`)
"""

from wavepp.kv_transfer.directory.store import (
    DirectoryStore,
    StagePart,
    Transfer,
    TransferError,
    check_transfer_id,
)

__all__ = ["DirectoryStore", "StagePart", "Transfer", "TransferError", "check_transfer_id"]
