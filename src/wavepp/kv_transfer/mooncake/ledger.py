"""A stage's staging arena for the network hand-off: which bytes of a registered buffer hold
which transfer, and the table a decode engine reads (and writes one word of) over the network.

    ledger = ArenaLedger(capacity, max_entries, ttl_s)
    slot = ledger.alloc(nbytes, now)     # room, the oldest transfers evicted for it; ArenaFull
    ... copy the rows into [slot.offset, slot.offset + nbytes) of the data region ...
    ledger.commit(slot)                  # now live: its entry carries its sequence number
    ledger.reclaim(now)                  # entries the decode side released, or past the TTL

The table (`ledger.table`, numpy uint64 [max_entries + 2, 4], registered with the transfer
engine beside the data): row 0 is the header [MAGIC, live entries, live bytes, capacity], row 1
the parts freed so far by why [released, expired, evicted, refused] (rank 0 reads both for
/metrics); row e >= 2 is entry e [seq, released, nbytes, offset]. A live entry's `seq` is
unique to it (a random base per arena plus a counter: a restarted stage never repeats one), 0
when free.

What the decode side relies on:
  - a pull is good only if the entry's `seq` read *after* the data equals the one it was
    given: the arena zeroes `seq` before it lets anything overwrite an entry's bytes, and sets
    it only after the bytes are in place (commit);
  - it releases a transfer by writing that `seq` into `released`; the arena frees the entry
    when `released == seq` (a release that arrives after the entry was reused names another
    seq and is ignored).

Room is a ring over the data region in allocation order, so the bytes a new transfer needs
are always those of the oldest transfers still held: "oldest first" with no search. A
transfer larger than the whole region is refused (ArenaFull, with both sizes); the entries
table, when full, gives up its oldest entry. One thread only (the stage's export writer) calls
the ledger; the decode side's one write (`released`) is the only change from outside.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

MAGIC = 0x5741564550504B56  # "WAVEPPKV"
ALIGN = 64  # every transfer starts on a cache line
SEQ, RELEASED, NBYTES, OFFSET = range(4)  # an entry's words
HEADER_ROWS = 2  # the table's rows before its first entry
DEFAULT_MAX_ENTRIES = 4096  # parts an arena holds at most


def size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


class ArenaFull(Exception):
    """A transfer the arena cannot hold at all (larger than its data region)."""


@dataclass(frozen=True)
class Slot:
    entry: int
    seq: int
    offset: int
    nbytes: int


class ArenaLedger:
    def __init__(self, capacity: int, max_entries: int = DEFAULT_MAX_ENTRIES, ttl_s: float = 600.0):
        if capacity < ALIGN:
            raise ValueError(f"an arena needs at least {ALIGN} bytes, got {capacity}")
        if max_entries < 1:
            raise ValueError(f"an arena needs at least one entry, got {max_entries}")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.table = np.zeros((max_entries + HEADER_ROWS, 4), dtype=np.uint64)
        self.table[0] = (MAGIC, 0, 0, capacity)
        # entry numbers, pop() gives the lowest
        self._free = list(range(max_entries + HEADER_ROWS - 1, HEADER_ROWS - 1, -1))
        # entry -> (slot, since): live and reserved entries, oldest first (= ring order)
        self._held: OrderedDict[int, tuple[Slot, float]] = OrderedDict()
        self._head = 0
        # below 2**52, so a JSON reader that parses numbers as doubles keeps it exact
        self._next_seq = (secrets.randbits(31) + 1) << 20

    @property
    def table_bytes(self) -> int:
        return self.table.nbytes

    # parts freed because the decode side (or rank 0) released them, the TTL passed, a newer part
    # needed the room or the entry; and parts refused, larger than the arena
    num_released = property(lambda self: int(self.table[1, 0]))
    num_expired = property(lambda self: int(self.table[1, 1]))
    num_evicted = property(lambda self: int(self.table[1, 2]))
    num_refused = property(lambda self: int(self.table[1, 3]))

    @property
    def live_entries(self) -> int:
        return int(self.table[0, 1])

    @property
    def live_bytes(self) -> int:
        return int(self.table[0, 2])

    def alloc(self, nbytes: int, now: float) -> Slot:
        """Room for `nbytes`: the entries it overlaps (the oldest) are evicted first. The slot
        is not visible to readers until `commit`. ArenaFull when nbytes > capacity."""
        if nbytes > self.capacity:
            self.table[1, 3] += 1
            raise ArenaFull(
                f"the transfer needs {size_text(nbytes)}; this stage's arena holds "
                f"{size_text(self.capacity)} (raise --kv-arena-gib)"
            )
        self.reclaim(now)
        start = self._head
        if start + nbytes > self.capacity:
            start = 0  # the ring wraps: the tail's bytes wait for the next lap
        end = start + nbytes
        for entry, (slot, _) in list(self._held.items()):
            if slot.offset < end and start < slot.offset + slot.nbytes:
                self._drop(entry)
                self.table[1, 2] += 1
        if not self._free:
            self._drop(next(iter(self._held)))
            self.table[1, 2] += 1
        entry = self._free.pop()
        self._next_seq += 1
        slot = Slot(entry, self._next_seq, start, nbytes)
        self._held[entry] = (slot, now)
        self._head = min(self.capacity, -(-end // ALIGN) * ALIGN)
        return slot

    def commit(self, slot: Slot) -> None:
        """The slot's bytes are in place: readers may take it from here."""
        row = self.table[slot.entry]
        row[RELEASED], row[NBYTES], row[OFFSET] = 0, slot.nbytes, slot.offset
        row[SEQ] = slot.seq  # last: a reader that sees this seq sees the bytes
        self.table[0, 1] += 1
        self.table[0, 2] += slot.nbytes

    def cancel(self, slot: Slot) -> None:
        """A slot whose bytes could not be written: freed, never seen."""
        if slot.entry in self._held and self._held[slot.entry][0] == slot:
            self._drop(slot.entry)

    def reclaim(self, now: float) -> int:
        """Free the entries the decode side released and those past the TTL; how many. One
        numpy pass finds the released; the TTL looks at the oldest entries only (held in
        allocation order)."""
        freed = 0
        entries = self.table[HEADER_ROWS:]
        seq, released = entries[:, SEQ], entries[:, RELEASED]
        for i in np.flatnonzero((seq != 0) & (released == seq)):
            self._drop(int(i) + HEADER_ROWS)
            self.table[1, 0] += 1
            freed += 1
        for entry, (_, since) in list(self._held.items()):
            if now - since < self.ttl_s:
                break
            if self.table[entry, SEQ] == 0:
                continue  # reserved, not committed yet
            self._drop(entry)
            self.table[1, 1] += 1
            freed += 1
        return freed

    def clear(self) -> None:
        for entry in list(self._held):
            self._drop(entry)

    def __len__(self) -> int:
        return len(self._held)

    def _drop(self, entry: int) -> None:
        slot, _ = self._held.pop(entry)
        row = self.table[entry]
        if row[SEQ] != 0:
            self.table[0, 1] -= 1
            self.table[0, 2] -= slot.nbytes
        row[SEQ] = 0  # first: a reader that pulled bytes about to change sees it
        row[RELEASED] = row[NBYTES] = row[OFFSET] = 0
        self._free.append(entry)
