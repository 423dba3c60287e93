"""What the KV hand-off holds now, as /metrics shows it: one typed record for both transports,
each filling the part it has (the directory store's bytes and cap, or every stage's arena).

    usage = handoff.usage()
    usage.store_bytes, usage.store_max_bytes   the directory store (None: the transport has none)
    usage.arenas                               {stage: ArenaUsage} (None: it keeps no arenas)
    usage.num_swept                            transfers the TTL or the size cap dropped

Pure: no torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ArenaUsage:
    """One stage's arena, read from its table's header: the parts it holds, their bytes, its
    size, and the parts it let go so far by why ("released", "expired", "evicted", "refused")."""

    num_entries: int
    num_bytes: int
    capacity_bytes: int
    freed: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class HandoffUsage:
    num_swept: int = 0
    store_bytes: int | None = None  # the directory store's bytes at its last sweep
    store_max_bytes: int | None = None  # its size cap
    arenas: dict[int, ArenaUsage] | None = None  # the Mooncake transport: stage -> its arena
