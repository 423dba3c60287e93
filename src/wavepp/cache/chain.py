"""A request's own entries in the prefix index: linked in at commit, unlinked when it ends.

    leased (agreed prefix) | borrowed (cached here beyond it) | own: new PENDING entries
    [0, num_leased)          computed again, privately           linked while the chain holds

`BlockPool` drives these; they keep the index's invariants (a linked entry's parent is held
by its owner, so eviction never cuts a chain under a PENDING entry).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from wavepp.cache.block import BlockEntry
from wavepp.cache.pool_request import PoolRequest
from wavepp.cache.prefix_index import PrefixIndex


class RequestChains(PrefixIndex):
    """The index side of a request's life; subclasses hold `_requests` and `max_leased_blocks`."""

    _requests: dict[Hashable, PoolRequest]
    max_leased_blocks: int | None

    def _register(self, request: PoolRequest, new_block_hashes: Sequence[int]) -> int:
        """Create the request's own entries at commit; link the new hashes while the chain holds."""
        escrow = request.escrow
        assert escrow is not None
        parent = request.leased[-1] if request.leased else None
        # Link only onto a parent the request holds and that is still findable: a linked
        # entry's parent must be held by its owner, or eviction could cut the chain under it.
        # Cached entries right after the lease are borrowed (held) and linked under; once any
        # other hash is taken already (deduplicated), the rest stay private.
        linking = parent is None or parent.linked
        index, request_id = self._index, request.request_id
        depth = len(request.leased)
        own = []
        num_registered = 0
        for block_hash in new_block_hashes:
            if not linking:
                break
            taken = index.get(block_hash)
            if taken is not None:
                if num_registered or not self._borrowable(taken, parent):
                    break
                self._borrow(request, taken)
                own.append(BlockEntry(None, None, depth, request_id))  # computed again, privately
                parent = taken
                depth += 1
                continue
            entry = BlockEntry(block_hash, parent, depth, request_id, None, False, True)
            index[block_hash] = entry
            if parent is not None:
                parent.num_children += 1
            parent = entry
            own.append(entry)
            depth += 1
            num_registered += 1
        for unhashed_depth in range(depth, len(request.leased) + escrow.num_blocks):
            own.append(BlockEntry(None, None, unhashed_depth, request_id))
        self._pending_registered(num_registered)
        request.own = own
        request.new_block_hashes = tuple(new_block_hashes)
        return num_registered

    def _borrowable(self, entry: BlockEntry, parent: BlockEntry | None) -> bool:
        """A cached entry the committing request may hold beyond its lease: computed, the next
        block of its chain, no escrow's victim, within the lease cap."""
        if not entry.computed or entry.parent is not parent or entry.victim_of is not None:
            return False
        cap = self.max_leased_blocks
        return cap is None or entry.ref_count > 0 or self._num_leased < cap

    def _borrow(self, request: PoolRequest, entry: BlockEntry) -> None:
        if entry.ref_count == 0:
            self._pin(was_victim=False)
        entry.ref_count += 1
        self._touch(entry)
        request.borrowed.append(entry)

    def _drop_borrowed(self, request: PoolRequest) -> None:
        """Let go of the borrowed entries, deepest first (after the own entries under them)."""
        for entry in reversed(request.borrowed):
            entry.ref_count -= 1
            if entry.ref_count == 0:
                self._unpin(entry)
        request.borrowed = []

    def _drop_own(self, request: PoolRequest) -> None:
        """The owner lets go of its own entries, deepest first (children before parents)."""
        for entry in reversed(request.own):
            if entry.linked and not entry.computed:
                if entry.ref_count > 1:  # readers leased it
                    self._unlink_pending(entry)
                else:
                    self._unlink(entry)
            entry.owned = False
            entry.ref_count -= 1
            if entry.block_id is None:
                continue
            self._owner_let_go(entry)
        request.own = []
        request.new_block_hashes = ()

    def _unlink_pending(self, entry: BlockEntry) -> None:
        """Take a never-computed entry out of the index, and every PENDING entry built on it:
        the own entries of requests that leased it (and of requests that leased theirs...)."""
        doomed, seen = [entry], {entry}
        for dying in doomed:  # grows while we walk it
            if dying.ref_count > int(dying.owned):  # someone leased it
                for reader in self._requests.values():
                    if len(reader.leased) > dying.depth and reader.leased[dying.depth] is dying:
                        fresh = [own for own in reader.own if own.linked and own not in seen]
                        doomed.extend(fresh)
                        seen.update(fresh)
        for dying in reversed(doomed):
            self._unlink(dying)
