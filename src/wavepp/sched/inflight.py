"""Blocks in flight: what admitted requests will compute, and who waits for them.

A request admitted after another one that computes the same blocks does not compute them
again: it leases them as *pending* blocks on every stage and may be planned only in a wave
after the one that dispatched them (a `Dependency` on their owner). On a hybrid model it also
leases the pending state snapshot at its boundary, which sits on the owner's last block it
reuses: the same dependency orders the owner's chunk that writes it first on every stage. Stages dedup differently
(a block cached on one stage is recomputed for another), so a block may have several owners.

When an owner leaves before it dispatched its blocks (aborted, or sent back to waiting because
one of its own owners left), those blocks will never be computed: they are *dead* until the
owner's release has run on every stage (it rides on the next wave). Every request that
depends on them goes back to waiting, and so on down the chain; a request whose round leased
a dead block is not admitted but retried once the release has run.

    register(req, k)      req computes its full blocks [k, num_full): it owns them
    dependencies(req, k)  the owners of req's leased blocks [0, k)
    dispatched(req, a, b) req's blocks [a, b) left in a wave: it no longer owns them
    withdraw(req, wave)   req leaves undispatched: its blocks [scheduled, num_full) are dead
                          until `wave` waves have finished
    dead_until(req, k)    waves that must finish before req's leased blocks [0, k) are sound

Pure bookkeeping keyed by block hash and request id; it holds entries only for requests that
are admitted and not done, so its size is bounded by the work in flight.
"""

from __future__ import annotations

from wavepp.sched.request import Dependency, Request


class InflightBlocks:
    def __init__(self, block_size: int):
        self.block_size = block_size
        # hash -> {owner id: tokens through the block}
        self._owners: dict[int, dict[int, int]] = {}
        # hash -> number of waves that must finish before the block is gone from every stage
        self._dead: dict[int, int] = {}

    def __len__(self) -> int:
        """Entries held (owned blocks and dead marks): bounded by the work in flight."""
        return len(self._owners) + len(self._dead)

    def register(self, req: Request, num_leased_blocks: int) -> None:
        """`req` was admitted reusing `num_leased_blocks`: it computes the rest of its full blocks."""
        bs = self.block_size
        for j in range(num_leased_blocks, req.num_tokens // bs):
            self._owners.setdefault(req.block_hashes[j], {})[req.request_id] = (j + 1) * bs

    def dependencies(self, req: Request, num_leased_blocks: int) -> list[Dependency]:
        """Owners of `req`'s leased blocks that have not dispatched them yet."""
        needs: dict[int, int] = {}
        for h in req.block_hashes[:num_leased_blocks]:
            for owner_id, num_tokens in self._owners.get(h, {}).items():
                needs[owner_id] = max(needs.get(owner_id, 0), num_tokens)
        return [Dependency(o, t) for o, t in sorted(needs.items())]

    def dispatched(self, req: Request, start_block: int, end_block: int) -> None:
        for j in range(start_block, end_block):
            self._drop(req.block_hashes[j], req.request_id)

    def withdraw(self, req: Request, release_done: int) -> set[int]:
        """`req` leaves before dispatching its blocks [num_scheduled, num_full): they are dead
        until `release_done` waves have finished. Returns their hashes."""
        bs = self.block_size
        dead = set()
        for j in range(req.num_scheduled_tokens // bs, req.num_tokens // bs):
            h = req.block_hashes[j]
            self._drop(h, req.request_id)
            self._dead[h] = max(self._dead.get(h, 0), release_done)
            dead.add(h)
        return dead

    def dead_until(self, req: Request, num_leased_blocks: int) -> int:
        """The wave count after which every one of `req`'s leased blocks is sound (0: now)."""
        if not self._dead:
            return 0
        return max((self._dead.get(h, 0) for h in req.block_hashes[:num_leased_blocks]), default=0)

    def on_wave_done(self, num_waves_done: int) -> None:
        """Forget dead marks whose release has run."""
        if self._dead:
            self._dead = {h: n for h, n in self._dead.items() if n > num_waves_done}

    def owns_any(self, request_id: int) -> bool:
        """Whether `request_id` still owns a block (for integrity checks)."""
        return any(request_id in owners for owners in self._owners.values())

    def _drop(self, block_hash: int, owner_id: int) -> None:
        owners = self._owners.get(block_hash)
        if owners is not None and owners.pop(owner_id, None) is not None and not owners:
            del self._owners[block_hash]
