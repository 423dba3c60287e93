"""One stage's KV block pool: prefix index, ref counts, leaf-only LRU eviction, lease, escrow.

The leader drives every stage's pool through one admission round per request:

    match(hashes)            probe: longest cached prefix here (mutates nothing)
    lease(id, hashes, n)     pin the prefix the leader agreed on (the minimum over stages)
    reserve(id, n)           escrow: hold victims for n new blocks, evict nothing yet
    commit(id, new_hashes)   re-check victims, register the new blocks as PENDING entries
    cancel(id) / release(id) undo, if any stage said no

and later, as chunks of the request pass this stage:

    materialize(id)          evict the victims, hand out the block table
    publish(id, n_tokens)    tokens [0, n_tokens) are written: PENDING -> COMPUTED
    free(id)                 done: computed blocks stay cached, the rest is freed

Everything is deterministic: recency is a logical clock ticked once per touched block, ties
break on depth then block id, and free blocks go out lowest id first. Pure Python, no locks:
one caller at a time (the stage's admission loop or the simulator).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import cast

from wavepp.cache import integrity
from wavepp.cache.block import BlockEntry
from wavepp.cache.chain import RequestChains
from wavepp.cache.errors import (
    AlreadyReleasedError,
    InvalidArgumentError,
    PendingBlockError,
    RequestStateError,
    UnknownRequestError,
)
from wavepp.cache.escrow import Escrow, Victim, pick_victims, unmark_victim
from wavepp.cache.host_tier import HostTier
from wavepp.cache.pool_request import PoolRequest
from wavepp.cache.results import CommitResult, LeaseResult, PoolRequestState, ReserveResult

_NUM_RETIRED_REMEMBERED = 1 << 16  # released ids kept to tell "released twice" from "unknown"
_RESERVED = (PoolRequestState.RESERVED,)
_COMMITTED = (PoolRequestState.COMMITTED,)
_MATERIALIZED = (PoolRequestState.MATERIALIZED,)


class BlockPool(RequestChains):
    """The block pool of one pipeline stage. See the module docstring for the round.

    num_blocks blocks of block_size tokens; max_leased_blocks caps the blocks held by leases
    alone (None: no cap); host_tier keeps the computed blocks eviction takes (None: dropped).
    match, match_linear and capacity come from `PrefixIndex`, the linking of a request's
    entries into the index from `RequestChains`.

    `keeps_snapshots`: the pool's declared capability (as a layer declares its cache spec):
    a hybrid model's pool (SnapshotPool) also keeps recurrent-state snapshots, and a request
    resumes only where one is held; its users read this, never probe for methods.
    """

    keeps_snapshots = False

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        max_leased_blocks: int | None = None,
        host_tier: HostTier | None = None,
    ) -> None:
        super().__init__(num_blocks, block_size, host_tier)
        if max_leased_blocks is not None and max_leased_blocks < 0:
            raise InvalidArgumentError(f"max_leased_blocks must be >= 0, got {max_leased_blocks}")
        self.max_leased_blocks = max_leased_blocks
        self._requests: dict[Hashable, PoolRequest] = {}
        self._retired: dict[Hashable, None] = {}

    # ---- admission: lease, reserve, commit, cancel -------------------------------------------

    def lease(
        self, request_id: Hashable, block_hashes: Sequence[int], num_blocks: int
    ) -> LeaseResult:
        """Pin the first `num_blocks` entries of `block_hashes` for `request_id` (ref + 1 each).

        The blocks are safe to read from until release/free. Touches them in prefix order.
        Must be the request's first call on this pool. Not ok (nothing changes) if a block is
        no longer in the index, if the lease cap would be exceeded, or if a block is a victim
        of a committed escrow for which no replacement is left. Leasing a victim of a
        reserved (uncommitted) escrow takes it from that escrow; its commit replaces it.
        """
        if request_id in self._requests:
            state = self._requests[request_id].state.value
            raise RequestStateError(
                request_id, "lease", state, "a request leases once, before reserve"
            )
        if not 0 <= num_blocks <= len(block_hashes):
            raise InvalidArgumentError(
                f"lease: num_blocks={num_blocks} not in [0, {len(block_hashes)}]"
            )
        entries: list[BlockEntry] = []
        for block_hash in block_hashes[:num_blocks]:
            entry = self._index.get(block_hash)
            if entry is None:
                reason = f"block {len(entries)} of the {num_blocks} to lease is no longer cached"
                return LeaseResult(False, 0, reason)
            entries.append(entry)
        num_new_leased = sum(1 for e in entries if e.ref_count == 0)
        cap = self.max_leased_blocks
        if cap is not None and self._num_leased + num_new_leased > cap:
            reason = f"lease cap: {self._num_leased} leased + {num_new_leased} new > {cap}"
            return LeaseResult(False, 0, reason)
        claims = [e for e in entries if e.victim_of is not None]
        replacements = self._replace_committed_claims(claims, set(entries))
        if replacements is None:
            owners = sorted({repr(e.victim_of) for e in claims})
            reason = f"would take escrow victims of committed request(s) {', '.join(owners)}, none to spare"
            return LeaseResult(False, 0, reason)
        for escrow, picks in replacements:
            escrow.victims.update(picks)
            self._hold(picks)
        for entry in entries:
            if entry.victim_of is not None:
                del self._requests[entry.victim_of].escrow.victims[entry.block_id]  # type: ignore[union-attr, arg-type]
                unmark_victim(entry)
                self._pin(was_victim=True)
            elif entry.ref_count == 0:
                self._pin(was_victim=False)
            entry.ref_count += 1
            self._touch(entry)
        self._retired.pop(request_id, None)
        self._requests[request_id] = PoolRequest(request_id, entries)
        self._maybe_compact()
        return LeaseResult(True, num_blocks, num_claimed=len(claims))

    def reserve(self, request_id: Hashable, num_blocks: int) -> ReserveResult:
        """Hold victims for `num_blocks` new blocks of `request_id`; evict nothing yet.

        Victims: free blocks (lowest id first), then evictable leaves in LRU order, a parent
        counting as a leaf once all its children are victims. Never a referenced, pending or
        other escrow's block. Not ok (holds nothing) if free + evictable blocks are too few.
        The request may have leased before (and must not hold an escrow already).
        """
        if num_blocks < 0:
            raise InvalidArgumentError(f"reserve: num_blocks must be >= 0, got {num_blocks}")
        request = self._requests.get(request_id)
        if request is not None and request.state is not PoolRequestState.LEASED:
            detail = "it already holds an escrow or blocks"
            raise RequestStateError(request_id, "reserve", request.state.value, detail)
        picks = pick_victims(self._free_ids, self._leaves, num_blocks, request_id)
        if len(picks) < num_blocks:
            self._hold(picks)
            self._give_back(picks)
            reason = f"need {num_blocks} blocks, only {len(picks)} claimable now"
            return ReserveResult(False, 0, (), reason)
        if request is None:
            self._retired.pop(request_id, None)
            request = self._requests[request_id] = PoolRequest(request_id, [])
        request.escrow = Escrow(num_blocks, dict(picks))
        self._hold(picks)
        return ReserveResult(True, num_blocks, tuple(block_id for block_id, _ in picks))

    def commit(self, request_id: Hashable, new_block_hashes: Sequence[int]) -> CommitResult:
        """Confirm the reservation and register the new full blocks as PENDING entries.

        new_block_hashes: hashes of the request's new full blocks, in order, continuing the
        chain after its leased prefix (at most the reserved count: a partial last block has
        none). A hash already in the index is not registered twice: that block stays private
        to the request. Where such blocks come first, right after the leased prefix, and are
        cached here (computed, not an escrow victim), the request pins them (`borrowed`) and
        registers the hashes after them beneath them: a stage that holds more of a chain than
        the prefix agreed over all stages keeps the chain whole. Past any other taken hash,
        every block stays private.
        Victims claimed since reserve are replaced first; if that is impossible the escrow is
        dropped (the lease stays) and the result is not ok. After an ok commit, materialize
        cannot fail for lack of room: leases that would take a victim must leave a replacement.
        """
        request = self._get(request_id, "commit", _RESERVED, "commit needs a reservation")
        escrow = request.escrow
        assert escrow is not None
        if len(new_block_hashes) > escrow.num_blocks:
            raise InvalidArgumentError(
                f"commit: {len(new_block_hashes)} new hashes for {escrow.num_blocks} reserved blocks"
            )
        num_missing = escrow.num_missing
        if num_missing:
            picks = pick_victims(self._free_ids, self._leaves, num_missing, request_id)
            if len(picks) < num_missing:
                self._hold(picks)
                self._give_back(picks)
                self._return_escrow(request)
                reason = f"{num_missing} victims were claimed since reserve, only {len(picks)} replaceable"
                return CommitResult(False, 0, reason)
            escrow.victims.update(picks)
            self._hold(picks)
        num_registered = self._register(request, new_block_hashes)
        escrow.committed = True
        return CommitResult(True, num_missing, num_registered=num_registered)

    def cancel(self, request_id: Hashable) -> None:
        """Give back the escrow of a reserved or committed request; its lease stays.

        A committed request's PENDING entries leave the index (readers that leased one keep
        it, dead). The request is LEASED again and may reserve anew.
        """
        request = self._get(
            request_id, "cancel", _RESERVED + _COMMITTED, "nothing reserved to cancel"
        )
        self._drop_own(request)
        self._drop_borrowed(request)
        self._return_escrow(request)

    # ---- execution: materialize, publish, free ----------------------------------------------

    def materialize(self, request_id: Hashable) -> list[int]:
        """Turn the committed escrow into blocks; return the request's whole block table.

        Evicts the cached victims now (their hashes leave the index), gives the request's new
        entries their block ids (victims in reservation order), and returns leased block ids
        followed by new ones. Raises PendingBlockError, changing nothing, if a leased entry's
        owner has not materialized it yet or let it go uncomputed.
        """
        request = self._get(
            request_id, "materialize", _COMMITTED, "only a committed escrow materializes"
        )
        for entry in request.leased:
            if not entry.computed and not entry.owned:
                detail = "was released before it was computed"
                raise PendingBlockError(request_id, entry.owner_id, "materialize", detail)
            if entry.block_id is None:
                raise PendingBlockError(
                    request_id, entry.owner_id, "materialize", "is not materialized yet"
                )
        escrow = request.escrow
        assert escrow is not None
        for victim in escrow.victims.values():
            if victim is None:
                continue
            if victim.linked:  # (else another escrow's materialize evicted its parent already)
                self._evict(victim)
            victim.victim_of = None
            victim.block_id = None  # the block now belongs to one of the request's entries
        block_ids = list(escrow.victims)
        for entry, block_id in zip(request.own, block_ids):
            entry.block_id = block_id
            self._block_entries[block_id] = entry
        self._escrow_to_in_use(len(block_ids))
        request.escrow = None
        leased_ids = cast("list[int]", [e.block_id for e in request.leased])  # checked above
        request.block_table = leased_ids + block_ids
        return list(request.block_table)

    def publish(self, request_id: Hashable, num_computed_tokens: int) -> None:
        """Tokens [0, num_computed_tokens) of the request are written on this stage.

        Its PENDING entries now fully covered become COMPUTED (and touched, in prefix order).
        Idempotent for a count <= the last one. Raises InvalidArgumentError beyond the
        request's blocks, PendingBlockError if its leased prefix is not computed yet.
        """
        request = self._get(
            request_id, "publish", _MATERIALIZED, "publish needs materialized blocks"
        )
        block_size = self.block_size
        num_leased = len(request.leased)
        num_tokens = request.num_blocks * block_size
        if not 0 <= num_computed_tokens <= num_tokens:
            raise InvalidArgumentError(
                f"publish: request {request_id!r} has {num_tokens} tokens of blocks, "
                f"got {num_computed_tokens}"
            )
        if num_computed_tokens <= request.num_computed_tokens:
            return
        # tokens: [0, num_leased * B) leased | [num_leased * B, num_tokens) own blocks
        if (
            num_computed_tokens > num_leased * block_size
            and num_leased
            and not request.leased[-1].computed
        ):
            owner_id = request.leased[-1].owner_id
            raise PendingBlockError(
                request_id, owner_id, "publish", "is not computed (published) yet"
            )
        start = max(request.num_computed_tokens // block_size - num_leased, 0)  # own block index
        end = max(num_computed_tokens // block_size - num_leased, 0)
        for entry in request.own[start:end]:
            if entry.linked and not entry.computed:
                self._pending_computed(entry)
        request.num_computed_tokens = num_computed_tokens

    def free(self, request_id: Hashable) -> None:
        """A materialized request is done: give back all it holds (see `release`)."""
        detail = "free is for materialized requests; use release"
        self._retire(self._get(request_id, "free", _MATERIALIZED, detail))

    def release(self, request_id: Hashable) -> None:
        """Give back everything the request holds, in any state: escrow, own entries, lease.

        COMPUTED entries stay cached (evictable once unreferenced). Never-computed PENDING
        entries and private blocks leave the index and go back to the free list once nobody
        references them; a PENDING entry another request leased stays, dead (unmatchable),
        until that reader lets go too, and the readers' own PENDING entries built on it leave
        the index with it.
        """
        self._retire(self._get(request_id, "release"))

    # ---- views ------------------------------------------------------------------------------

    def has_request(self, request_id: Hashable) -> bool:
        return request_id in self._requests

    def request_state(self, request_id: Hashable) -> PoolRequestState:
        return self._get(request_id, "request_state").state

    def block_table(self, request_id: Hashable) -> list[int]:
        """Block ids of a materialized request: leased prefix, then its own blocks."""
        request = self._get(request_id, "block_table", _MATERIALIZED, "not materialized")
        return list(request.block_table)  # type: ignore[arg-type]

    def check_integrity(self) -> None:
        """Raise IntegrityError naming the first broken invariant; O(pool size)."""
        integrity.check_pool(self)

    # ---- private helpers --------------------------------------------------------------------

    def _get(
        self,
        request_id: Hashable,
        operation: str,
        states: tuple[PoolRequestState, ...] = (),
        detail: str = "",
    ) -> PoolRequest:
        """The request's record; raises if unknown, or if `states` are given and it is in none."""
        request = self._requests.get(request_id)
        if request is None:
            if request_id in self._retired:
                raise AlreadyReleasedError(request_id, operation)
            raise UnknownRequestError(request_id, operation)
        if states and request.state not in states:
            raise RequestStateError(request_id, operation, request.state.value, detail)
        return request

    def _replace_committed_claims(
        self, claims: list[BlockEntry], leasing: set[BlockEntry]
    ) -> list[tuple[Escrow, list[Victim]]] | None:
        """Replacements for victims a lease takes from committed escrows; None if impossible."""
        by_owner: dict[Hashable, list[BlockEntry]] = {}
        for entry in claims:
            if self._requests[entry.victim_of].escrow.committed:  # type: ignore[union-attr]
                by_owner.setdefault(entry.victim_of, []).append(entry)
        done: list[tuple[Escrow, list[Victim]]] = []
        for owner_id, claimed in by_owner.items():
            escrow = self._requests[owner_id].escrow
            assert escrow is not None
            picks = pick_victims(self._free_ids, self._leaves, len(claimed), owner_id, leasing)
            done.append((escrow, picks))
            if len(picks) < len(claimed):
                for _, undo in reversed(done):
                    self._hold(undo)
                    self._give_back(undo)
                return None
        return done

    def _return_escrow(self, request: PoolRequest) -> None:
        escrow = request.escrow
        assert escrow is not None
        self._give_back(list(escrow.victims.items()))
        request.escrow = None

    def _retire(self, request: PoolRequest) -> None:
        if request.escrow is not None:
            self._return_escrow(request)
        self._drop_own(request)
        self._drop_borrowed(request)
        for entry in reversed(request.leased):
            was_leased = entry.block_id is not None and not entry.owned
            entry.ref_count -= 1
            if was_leased and entry.ref_count == 0:  # (dead and never materialized: nothing)
                self._unpin(entry)
        request.leased = []
        del self._requests[request.request_id]
        self._retired[request.request_id] = None
        if len(self._retired) > _NUM_RETIRED_REMEMBERED:
            del self._retired[next(iter(self._retired))]
        self._maybe_compact()
