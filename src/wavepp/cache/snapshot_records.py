"""The records of a `SnapshotPool`: a snapshot, one request's snapshot plan, and a hint.

A snapshot is *pending* from the commit of the request that will write it (its owner) until
the owner publishes the block it follows; it sits on one of the owner's own PENDING entries,
and like that entry it can be leased before it is written. If the owner lets its block go
unwritten, the snapshot is *dead*: out of the pool's map (unmatchable), its slot held until
the requests that leased it let go too.

    pending --owner publishes its block--> computed --evicted--> slot free
       |
       +--owner leaves first--> dead --last reader lets go--> slot free
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Snapshot:
    """The state after block `num_blocks` - 1 of a chain, in slot `slot`."""

    block_hash: int
    num_blocks: int  # the boundary, in blocks
    slot: int
    grid: bool
    parent: Snapshot | None  # grid snapshots: the one at the previous grid point
    owner_id: Hashable = None  # the request that writes it (kept for messages and checks)
    computed: bool = True  # False: pending, its owner has not written it yet
    dead: bool = False  # pending and dropped: held only by the requests leasing it
    ref_count: int = 0  # leasing requests
    num_grid_children: int = 0
    last_access: int = 0


@dataclass
class SnapshotPlan:
    """One request's slots: the boundaries it saves, and the working slot it carries between
    its chunks. A boundary is in `pending` (a pending snapshot others may lease, registered at
    commit) or in `slots` (attached at publish if it can be then); either way the request
    writes the state there when its chunk passes the boundary."""

    slots: dict[int, int] = field(
        default_factory=dict
    )  # boundary (blocks) -> slot, not yet attached
    pending: dict[int, Snapshot] = field(
        default_factory=dict
    )  # boundary (blocks) -> own pending snapshot
    working_slot: int | None = None
    leased: Snapshot | None = None

    def save_slots(self) -> dict[int, int]:
        """boundary (blocks) -> the slot the request writes there, for every boundary it has
        yet to compute."""
        out = dict(self.slots)
        out.update((b, s.slot) for b, s in self.pending.items())
        return out

    def held_slots(self) -> list[int]:
        """The slots the plan itself holds (pending snapshots hold their own)."""
        return [
            *self.slots.values(),
            *([self.working_slot] if self.working_slot is not None else []),
        ]


@dataclass(frozen=True, slots=True)
class SnapshotMatch:
    """num_grid_blocks: last grid boundary <= k with a snapshot, pending or computed (0 if
    none); num_end_blocks: k itself if it holds an off-grid snapshot, else 0."""

    num_grid_blocks: int
    num_end_blocks: int
    num_lookups: int

    @property
    def num_blocks(self) -> int:
        return max(self.num_grid_blocks, self.num_end_blocks)
