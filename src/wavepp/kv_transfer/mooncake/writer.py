"""A stage's side of the Mooncake transport: an arena of the stage's own, registered with a
Mooncake transfer engine of its own; each part is copied into it and kept until the decode side
pulled and released it, the TTL passed, or newer parts needed the room (oldest first;
ledger.py). The location a part's `put` returns says where to read (session, addresses, layout:
part.py); the decode side's engine reads it straight from this process's memory, over TCP or
RDMA. Nothing goes through rank 0 and nothing touches a file.

    writer = ArenaWriter(stage_id, host="10.0.0.5", protocol="tcp", arena_bytes=2 * 2**30)
    staged = writer.stage(pools, block_table, num_tokens)   # the compute loop: into the arena
    location = writer.put(transfer_id, staged, num_tokens, manifest)   # the writer thread
    writer.release(location) / writer.arena_header(location)           # rank 0's hand-off

It is a `StageWriter` (kv_transfer/interfaces.py), called from the stage's one export writer
thread (export.py), never from its compute loop but for `stage`; `release` and `arena_header`
also from rank 0's hand-off thread, through stage 0's writer (a lock guards the arena's table).
"""

from __future__ import annotations

import math
import threading
import time

import torch

from wavepp.kv_transfer.mooncake.engine import (
    DEFAULT_TIMEOUT_S,
    PeerUnreachable,
    SetAside,
    TransferEngineHandle,
)
from wavepp.kv_transfer.mooncake.ledger import (
    DEFAULT_MAX_ENTRIES,
    HEADER_ROWS,
    ArenaFull,
    ArenaLedger,
)
from wavepp.kv_transfer.mooncake.part import RELEASED_OFFSET, pack_layout
from wavepp.kv_transfer.usage import ArenaUsage

DEFAULT_ARENA_GIB = 2.0


class ArenaWriter:
    def __init__(
        self,
        stage_id: int,
        *,
        host: str,
        protocol: str = "tcp",
        arena_bytes: int = int(DEFAULT_ARENA_GIB * 2**30),
        ttl_s: float = 600.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock=time.monotonic,
    ):
        self.stage_id = stage_id
        self.clock = clock
        self.ledger = ArenaLedger(arena_bytes, max_entries, ttl_s)
        self.engine = TransferEngineHandle.start(host, protocol, timeout_s)
        # the entries' table and the data region, each registered: the table is what a decode
        # engine reads after its pull and writes to release a part
        self._table = torch.from_numpy(self.ledger.table.view("uint8").reshape(-1))
        # zeroed: every page is touched now, not on the compute loop at a part's first copy (and
        # the arena's memory is taken at start, as RDMA registration pins it anyway)
        self._data = torch.zeros(arena_bytes, dtype=torch.uint8)
        self._table_addr = self.engine.register(self._table)
        self._data_addr = self.engine.register(self._data)
        # rank 0's scratch: the word it writes to release a part, the header it reads for usage
        self._set_aside = SetAside()  # scratch a call still running may use
        self._new_scratch()
        self._lock = threading.Lock()  # the table: the writer thread and rank 0's hand-off

    @property
    def session(self) -> str:
        return self.engine.session

    def stage(self, pools, block_table: list[int], num_tokens: int):
        """Room in the arena, then the request's whole blocks copied straight into it (one copy,
        on the compute loop); the part is live once this returns. A part the arena cannot take
        comes back as its ArenaFull, for `put` to raise on the writer thread."""
        shapes = pools.export_shapes(num_tokens)
        nbytes, layout = pack_layout(shapes)
        try:
            with self._lock:
                slot = self.ledger.alloc(nbytes, self.clock())
        except ArenaFull as err:
            return err
        try:
            out = {}
            for name, (_, shape, dtype) in shapes.items():
                at = slot.offset + layout[name]["offset"]
                size = math.prod(shape) * dtype.itemsize
                out[name] = self._data[at : at + size].view(dtype).view(shape)
            pools.export_blocks_into(block_table, num_tokens, out)
        except BaseException:
            with self._lock:
                self.ledger.cancel(slot)
            raise
        with self._lock:
            self.ledger.commit(slot)
        _, shape, _ = next(iter(shapes.values()))
        return slot, layout, nbytes, shape[1] * shape[2]  # rows per layer: whole blocks

    def _new_scratch(self) -> None:
        self._word = torch.zeros(1, dtype=torch.int64)
        self._word_addr = self.engine.register(self._word)
        self._header = torch.zeros(8, dtype=torch.int64)
        self._header_addr = self.engine.register(self._header)

    def _remote(self, call, *args) -> None:
        """An engine call with the scratch (under the lock): a PeerUnreachable's running call
        keeps the scratch it has, and new scratch is used from here on."""
        self._set_aside.reclaim(self.engine)
        try:
            call(*args)
        except PeerUnreachable as err:
            self._set_aside.add(err.done, [self._word, self._header])
            self._new_scratch()
            raise

    def put(self, transfer_id: str, staged, num_tokens: int, manifest: dict) -> dict:
        """The staged part's location (nothing left to copy); its ArenaFull raised."""
        if isinstance(staged, Exception):
            raise staged
        slot, pools, nbytes, rows = staged
        return {
            "session": self.session,
            "stage": self.stage_id,
            "layers": list(manifest["layers"]),
            "entry": slot.entry,
            "seq": slot.seq,
            "entry_addr": self._table_addr + slot.entry * self.ledger.table.strides[0],
            "addr": self._data_addr + slot.offset,
            "nbytes": nbytes,
            "num_tokens": num_tokens,
            "rows": rows,  # rows per layer: whole blocks, past num_tokens
            "dtype": manifest["dtype"],
            "pools": pools,
        }

    def tick(self, now: float) -> None:
        with self._lock:
            self.ledger.reclaim(now)

    def release(self, location: dict) -> None:
        """Give a part up (rank 0: the decode side failed, or the request did): its `seq` into
        its entry's `released` word, here or on another stage's arena over the engine."""
        if location["session"] == self.session:
            with self._lock:
                if int(self.ledger.table[location["entry"], 0]) == location["seq"]:
                    self.ledger.table[location["entry"], 1] = location["seq"]
            return
        with self._lock:  # one word, one writer at a time
            self._word[0] = location["seq"]
            self._remote(
                self.engine.write,
                location["session"],
                self._word_addr,
                location["entry_addr"] + RELEASED_OFFSET,
                8,
            )

    def arena_header(self, location: dict) -> ArenaUsage:
        """What the arena `location` is in holds now and has freed (this one, or another
        stage's, read over the engine); TransferFailed when that stage is gone."""
        if location["session"] == self.session:
            header = self.ledger.table[:HEADER_ROWS].astype("int64").reshape(-1)
        else:
            table = location["entry_addr"] - location["entry"] * self.ledger.table.strides[0]
            with self._lock:
                self._remote(
                    self.engine.read, location["session"], [(self._header_addr, table, 64)]
                )
                header = self._header.numpy().copy()
        freed = dict(zip(("released", "expired", "evicted", "refused"), map(int, header[4:8])))
        return ArenaUsage(
            num_entries=int(header[1]),
            num_bytes=int(header[2]),
            capacity_bytes=int(header[3]),
            freed=freed,
        )

    def usage(self) -> dict:
        with self._lock:
            return {
                "bytes": self.ledger.live_bytes,
                "entries": self.ledger.live_entries,
                "capacity": self.ledger.capacity,
                "released": self.ledger.num_released,
                "expired": self.ledger.num_expired,
                "evicted": self.ledger.num_evicted,
                "refused": self.ledger.num_refused,
            }

    def close(self) -> None:
        with self._lock:
            self.ledger.clear()
        self.engine.close()
