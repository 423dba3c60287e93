"""A stage's side of the directory transport (`--kv-store DIR`): each part packed as
safetensors into the directory store (store.py), which a decode engine on the same file system
reads. No set-up; one host (or a shared file system).

    writer = DirectoryWriter(DirectoryStore(root))
    rows = writer.stage(pools, block_table, num_tokens)       # the compute loop: host rows
    writer.put(transfer_id, rows, num_tokens, manifest)       # the writer thread: pack + write

It is a `StageWriter` (kv_transfer/interfaces.py), called from the stage's one export writer
thread (export.py) but for `stage`, which runs on the compute loop.
"""

from __future__ import annotations

from safetensors.torch import save

from wavepp.kv_transfer.directory.store import DirectoryStore


class DirectoryWriter:
    def __init__(self, store: DirectoryStore):
        self.store = store

    def stage(self, pools, block_table: list[int], num_tokens: int) -> dict:
        """The request's rows, copied out of `pools` (PagedPools): {pool: (model layers,
        [layers, num_tokens, width])} on the host."""
        return pools.export_rows(block_table, num_tokens)

    def put(self, transfer_id: str, rows: dict, num_tokens: int, manifest: dict) -> None:
        """Pack the rows and write them, with their manifest, as this stage's part (None: the
        decode side finds the part by the transfer id alone). OSError when the store cannot
        take it."""
        tensors = {name: t for name, (_, t) in rows.items()}
        pools = {
            name: {"layers": layers, "width": int(t.shape[-1])}
            for name, (layers, t) in rows.items()
        }
        data = save(tensors, metadata={"transfer_id": transfer_id})
        self.store.write_part(
            transfer_id,
            manifest["stage_id"],
            data,
            {**manifest, "pools": pools, "num_tokens": num_tokens},
        )
        return None

    def tick(self, now: float) -> None:
        """Nothing to do: rank 0's hand-off sweeps the store."""
        return

    def release(self, location: dict) -> None:
        """Nothing to do: rank 0's hand-off removes a transfer given up."""
        return

    def close(self) -> None:
        return
