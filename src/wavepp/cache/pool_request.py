"""What one stage's pool holds for one request."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from wavepp.cache.block import BlockEntry
from wavepp.cache.escrow import Escrow
from wavepp.cache.results import PoolRequestState


@dataclass(slots=True, eq=False)
class PoolRequest:
    """One request's holdings on this stage (pool-private, mutable).

        [0, len(leased))                     leased prefix: entries of other requests or cached
        [len(leased), len(leased)+len(own))  own new blocks: PENDING entries, then private ones

    leased: pinned entries, one ref each, in prefix order (leased[i].depth == i).
    escrow: victims held for the own blocks until materialize.
    own: entries created at commit, one ref each (the owner's); block ids at materialize.
    borrowed: cached entries right after the leased prefix that this stage holds though the
        leader agreed a shorter prefix (another stage lacks them): the request computes those
        blocks again into private own blocks, and pins these (one ref each) so that its new
        blocks link under them and the chain stays whole here (borrowed[i].depth ==
        len(leased) + i). Not in the block table.
    new_block_hashes: the hashes given at commit (own entries may be private despite one).
    """

    request_id: Hashable
    leased: list[BlockEntry]
    escrow: Escrow | None = None
    own: list[BlockEntry] = field(default_factory=list)
    borrowed: list[BlockEntry] = field(default_factory=list)
    new_block_hashes: tuple[int, ...] = ()
    block_table: list[int] | None = None
    num_computed_tokens: int = 0

    @property
    def state(self) -> PoolRequestState:
        if self.block_table is not None:
            return PoolRequestState.MATERIALIZED
        if self.escrow is None:
            return PoolRequestState.LEASED
        return PoolRequestState.COMMITTED if self.escrow.committed else PoolRequestState.RESERVED

    @property
    def num_blocks(self) -> int:
        """Leased plus own (or reserved) blocks: the request's length in blocks, rounded up."""
        num_own = self.escrow.num_blocks if self.escrow is not None else len(self.own)
        return len(self.leased) + num_own

    def chain_hashes(self) -> list[int]:
        """The request's known chain: leased hashes then the hashes given at commit."""
        return [e.block_hash for e in self.leased] + list(self.new_block_hashes)  # type: ignore[return-value]
