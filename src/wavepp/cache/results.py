"""Result records of the block pool: what each operation tells its caller.

A record with `ok=False` means an expected shortage; the pool's state is then exactly as
before the call (except where a docstring says otherwise, e.g. a failed commit drops the
escrow), and `reason` says why in words a log line can carry.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class PoolRequestState(enum.Enum):
    """Where one request stands on one stage.

    LEASED -(reserve)-> RESERVED -(commit)-> COMMITTED -(materialize)-> MATERIALIZED
       ^                   |                     |
       +-----(cancel, failed commit)-------------+
    A request with no lease enters at RESERVED; release/free ends every state.
    """

    LEASED = "leased"
    RESERVED = "reserved"
    COMMITTED = "committed"
    MATERIALIZED = "materialized"


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Longest cached prefix of a chain of block hashes, on this stage.

    num_blocks: leading blocks present (COMPUTED or PENDING); leasable right now.
    num_lookups: index lookups spent (O(log num_blocks) thanks to leaf-only eviction).
    num_computed_blocks: leading blocks already COMPUTED (<= num_blocks).
    """

    num_blocks: int
    num_lookups: int
    num_computed_blocks: int


@dataclass(frozen=True, slots=True)
class LeaseResult:
    """num_blocks: blocks pinned (0 when not ok). num_claimed: escrow victims taken over."""

    ok: bool
    num_blocks: int
    reason: str = ""
    num_claimed: int = 0


@dataclass(frozen=True, slots=True)
class ReserveResult:
    """victims: block ids held for the request (free first, lowest id, then LRU leaves)."""

    ok: bool
    num_blocks: int
    victims: tuple[int, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CommitResult:
    """num_replaced: victims claimed since reserve and replaced now.

    num_registered: hashes entered in the prefix index as PENDING (the rest of the
    request's new blocks stay private: deduplicated, or the partial last block).
    """

    ok: bool
    num_replaced: int = 0
    reason: str = ""
    num_registered: int = 0


@dataclass(frozen=True, slots=True)
class CapacityView:
    """Physical blocks by state; the five block counts add up to num_blocks.

    num_free: unused, held by nobody.
    num_evictable: cached KV, unreferenced, not an escrow victim.
    num_leased: referenced by leases only (its owner, if any, has let go).
    num_escrowed: held as escrow victims (free or cached), not yet handed out.
    num_in_use: the own blocks of materialized requests (pending, computed or private).
    num_pending: PENDING index entries; a count of entries, not blocks (an entry gets its
        block only when its owner materializes).
    """

    num_free: int
    num_evictable: int
    num_leased: int
    num_escrowed: int
    num_pending: int
    num_in_use: int
    num_blocks: int

    @property
    def num_claimable(self) -> int:
        """Upper bound on what a new reservation can hold: free plus evictable."""
        return self.num_free + self.num_evictable
