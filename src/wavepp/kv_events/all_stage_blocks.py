"""Which blocks the pipeline holds on ALL of its stages: the prefix a request could reuse, as
the KV cache events a router reads announce it.

Each stage's pool records its computed blocks' changes, and its host tier's (cache/block_log.py);
rank 0 applies every stage's, in each stage's order, and announces a block when the last stage
holds it and withdraws it when the first stage lets it go. A stage holds a block in its pool or
in its host tier; the medium announced says where the slowest stage has it, as vLLM's names
go: GPU when every stage's pool holds it (reused as it is), CPU when some stage holds it only
in its host tier (reused after that stage loads it back). A block whose medium changes is
withdrawn under the old medium and announced under the new one, alone (its children stay):
Dynamo's KV router keeps a tree per medium and walks the GPU one, then the CPU one from where
the first ended, which is the prefix the leader agrees on (GPU part, then host part).

With `hybrid` (a model that resumes only at recurrent-state snapshots), a block held on every
stage is announced only if it leads to a snapshot every stage holds (anchors.py).

    apply(stage, changes)     a stage's STORED / REMOVED changes (or its whole set, a resync)
    note_prompt(req)          a prompt's block hashes and token ids (the events carry tokens;
                              the stages know only hashes)
    end_prompt(req)           the prompt ended: its tokens are let go after the next apply
    clear()                   every cache was emptied (a reset)
    take_events() -> [...]    StoredBlock / RemovedBlock / AllCleared, in order, once each

What must hold (`check_integrity`): an announced block is held on every stage, under the
medium that says where, and its parent is announced, so a router's tree never has a block
without its parent. A parent is announced before its children; a child waits (held everywhere,
not announced) while its parent is not, and is announced right after it; withdrawing a parent
withdraws its announced children first, and they come back with it (the chain is announced
again from where it is whole).

Tokens are kept while a live prompt has the block or stage 0 holds it, in its pool or its host tier
(every block held on all stages is held on stage 0), and then among the last `max_recent_blocks` let
go: a request that ended (aborted) while a chunk of it was in flight still has that chunk published
by the stages after its end. Bounded by stage 0's pool, the prompts in flight and
`max_recent_blocks`.

Pure: no lock, no thread, no clock; `KVEventsFeed` (feed.py) holds it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from wavepp.cache.block_log import (
    HOST_REMOVED,
    HOST_SNAP_REMOVED,
    HOST_SNAP_STORED,
    HOST_STORED,
    REMOVED,
    SNAP_REMOVED,
    SNAP_STORED,
    STORED,
    BlockChanges,
)
from wavepp.kv_events.anchors import Anchors

GPU = "GPU"  # vLLM's medium of the engine's own block pool, on any device: every stage's pool
CPU = "CPU"  # and of host memory beside it: some stage's host tier


@dataclass(frozen=True)
class StoredBlock:
    block_hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    medium: str = GPU


@dataclass(frozen=True)
class RemovedBlock:
    block_hash: int
    medium: str = GPU


@dataclass(frozen=True)
class AllCleared:
    pass


MAX_RECENT_BLOCKS = 16384  # tokens of blocks let go, kept for the stages' late changes


class AllStageBlocks:
    _held: list[set[int]]  # each stage's computed blocks in its pool, as its changes so far say
    _host: list[set[int]]  # and in its host tier
    _count: dict[int, int]  # hash -> stages that hold it in their pool (> 0)
    _reach: dict[int, int]  # hash -> stages that hold it in their pool or host tier (> 0)
    _parent: dict[int, int | None]  # of each hash some stage holds
    _kids: dict[int | None, set[int]]  # parent -> its held children
    _announced: dict[int, str]  # held on every stage, parent announced, tokens known -> medium
    _anchors: Anchors  # the stages' snapshots, and which blocks lead to one all hold (hybrid)
    _tokens: dict[int, tuple[int, ...]]
    _recent: OrderedDict[int, tuple[int, ...]]  # let go, oldest first
    _refs: dict[int, int]  # hash -> live prompts that have it
    _ended: list[list[int]]  # ended prompts' hashes, let go at the next apply
    _events: list[StoredBlock | RemovedBlock | AllCleared]

    def __init__(
        self,
        num_stages: int,
        block_size: int,
        max_recent_blocks: int = MAX_RECENT_BLOCKS,
        hybrid: bool = False,
    ) -> None:
        if num_stages < 1 or block_size < 1 or max_recent_blocks < 0:
            raise ValueError(
                f"num_stages and block_size must be >= 1, max_recent_blocks >= 0: {num_stages}, "
                f"{block_size}, {max_recent_blocks}"
            )
        self.num_stages, self.block_size = num_stages, block_size
        self.max_recent_blocks = max_recent_blocks
        self.hybrid = hybrid  # blocks are announced only on the way to an anchor
        self.num_without_tokens = 0  # blocks held everywhere whose tokens were not known
        self._empty()

    # ---- inputs ------------------------------------------------------------------------------

    def note_prompt(self, block_hashes, token_ids) -> None:
        """A prompt arrived: keep its full blocks' tokens (and announce any block that waited
        only for them)."""
        bs = self.block_size
        for i, block_hash in enumerate(block_hashes):
            self._refs[block_hash] = self._refs.get(block_hash, 0) + 1
            if block_hash not in self._tokens:
                tokens = self._recent.pop(block_hash, None)
                self._tokens[block_hash] = tokens or tuple(token_ids[i * bs : (i + 1) * bs])
                if self._reach.get(block_hash) == self.num_stages:
                    self._announce(block_hash)

    def end_prompt(self, block_hashes) -> None:
        """A prompt ended; its tokens go at the next apply's end (`mark` / `apply`)."""
        self._ended.append(list(block_hashes))

    def mark(self) -> int:
        """Taken before the stages' changes are asked: the prompts ended so far are let go by
        the apply that follows (stage 0's changes drained after this point include every block
        those prompts computed)."""
        return len(self._ended)

    def apply(self, stage_changes: list[tuple[int, BlockChanges]], mark: int) -> None:
        """Every stage's changes (stage id, BlockChanges), then let go of the prompts ended
        before `mark`."""
        for stage_id, changes in stage_changes:
            if changes.resync:
                self._resync(stage_id, changes.held)
                continue
            for kind, block_hash, parent_hash in changes.changes:
                self._change(stage_id, kind, block_hash, parent_hash)
        ended, self._ended = self._ended[:mark], self._ended[mark:]
        for block_hashes in ended:
            for block_hash in reversed(block_hashes):  # the root let go last, kept longest
                refs = self._refs.pop(block_hash, 1) - 1
                if refs:
                    self._refs[block_hash] = refs
                else:
                    self._maybe_forget_tokens(block_hash)

    def clear(self) -> None:
        """Every stage's cache was emptied (no prompt is in flight): forget all, say so once."""
        events = self._events  # (those not taken yet go out first)
        self._empty()
        self._events = events + [AllCleared()]

    def take_events(self) -> list[StoredBlock | RemovedBlock | AllCleared]:
        events, self._events = self._events, []
        return events

    def restatement(self) -> list[StoredBlock | AllCleared]:
        """The whole announced set as events: AllCleared, then every announced block, parents
        first (what a subscriber that missed a batch needs to be right again). Takes the events
        not taken yet: the restatement covers them."""
        self._events = []
        out: list[StoredBlock | AllCleared] = [AllCleared()]
        todo = sorted(h for h in self._kids.get(None, ()) if h in self._announced)
        while todo:
            block_hash = todo.pop()
            parent, tokens = self._parent[block_hash], self._tokens[block_hash]
            out.append(StoredBlock(block_hash, parent, tokens, self._announced[block_hash]))
            todo.extend(k for k in self._kids.get(block_hash, ()) if k in self._announced)
        return out

    # ---- views -------------------------------------------------------------------------------

    @property
    def announced(self) -> frozenset[int]:
        return frozenset(self._announced)

    def medium(self, block_hash: int) -> str | None:
        """Where an announced block is (GPU, CPU); None: not announced."""
        return self._announced.get(block_hash)

    @property
    def num_announced(self) -> int:
        return len(self._announced)

    def state_size(self) -> int:
        """Entries of every structure: bounded by the pools and the prompts in flight."""
        return (
            len(self._count)
            + self._anchors.state_size()
            + len(self._tokens)
            + len(self._recent)
            + len(self._refs)
            + len(self._ended)
        )

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant (see the module docstring)."""
        counts: dict[int, int] = {}
        reach: dict[int, int] = {}
        for held, host in zip(self._held, self._host):
            for block_hash in held:
                counts[block_hash] = counts.get(block_hash, 0) + 1
            for block_hash in held | host:
                reach[block_hash] = reach.get(block_hash, 0) + 1
        assert counts == self._count, "per-hash stage counts differ from the stages' sets"
        assert reach == self._reach, "per-hash stage reach differs from the stages' sets"
        self._anchors.check_integrity(list(self._parent.items()), self._whole)
        for block_hash, medium in self._announced.items():
            assert self._desired(block_hash) == medium, f"{block_hash} announced as {medium}"
            parent = self._parent[block_hash]
            assert parent is None or parent in self._announced, f"{block_hash}: parent missing"
            assert block_hash in self._tokens, f"{block_hash}: announced without tokens"

    # ---- helpers -----------------------------------------------------------------------------

    def _empty(self) -> None:
        self._held = [set() for _ in range(self.num_stages)]
        self._host = [set() for _ in range(self.num_stages)]
        self._count = {}
        self._reach = {}
        self._parent = {}
        self._kids = {}
        self._announced = {}
        self._anchors = Anchors(self.num_stages)
        self._tokens = {}
        self._recent = OrderedDict()
        self._refs = {}
        self._ended = []
        self._events = []

    def _holds(self, stage_id: int, block_hash: int) -> bool:
        return block_hash in self._held[stage_id] or block_hash in self._host[stage_id]

    def _desired(self, block_hash: int) -> str | None:
        """The medium a block held on every stage is announced under (None: not held by all,
        or, hybrid, leading to no anchor)."""
        if self.hybrid and not self._anchors.covered(block_hash):
            return None
        if self._count.get(block_hash) == self.num_stages:
            return GPU
        return CPU if self._reach.get(block_hash) == self.num_stages else None

    def _stored(self, stage_id: int, block_hash: int, parent_hash: int | None, host: bool) -> None:
        held = (self._host if host else self._held)[stage_id]
        if block_hash in held:
            return
        had = self._holds(stage_id, block_hash)
        held.add(block_hash)
        if stage_id == 0 and block_hash in self._recent:  # kept while stage 0 holds it
            self._tokens[block_hash] = self._recent.pop(block_hash)
        if not host:
            self._count[block_hash] = self._count.get(block_hash, 0) + 1
        if not had:
            reach = self._reach.get(block_hash, 0) + 1
            self._reach[block_hash] = reach
            if reach == 1:
                self._parent[block_hash] = parent_hash
                self._kids.setdefault(parent_hash, set()).add(block_hash)
        self._recover(block_hash)
        self._settle(block_hash)

    def _removed(self, stage_id: int, block_hash: int, host: bool) -> None:
        held = (self._host if host else self._held)[stage_id]
        if block_hash not in held:
            return
        held.discard(block_hash)
        if not host:
            count = self._count[block_hash] - 1
            if count:
                self._count[block_hash] = count
            else:
                del self._count[block_hash]
        reach = self._reach[block_hash]
        if not self._holds(stage_id, block_hash):
            reach -= 1
            if reach:
                self._reach[block_hash] = reach
            else:
                del self._reach[block_hash]
        self._recover(block_hash)
        self._settle(block_hash)
        if not reach:
            parent = self._parent.pop(block_hash)
            kids = self._kids[parent]
            kids.discard(block_hash)
            if not kids:
                del self._kids[parent]
        if stage_id == 0:
            self._maybe_forget_tokens(block_hash)

    def _change(self, stage_id: int, kind: int, block_hash: int, parent_hash) -> None:
        if kind == STORED or kind == HOST_STORED:
            self._stored(stage_id, block_hash, parent_hash, kind == HOST_STORED)
        elif kind == REMOVED or kind == HOST_REMOVED:
            self._removed(stage_id, block_hash, kind == HOST_REMOVED)
        elif kind == SNAP_STORED or kind == HOST_SNAP_STORED:
            if self._anchors.stored(stage_id, block_hash, kind == HOST_SNAP_STORED):
                self._recover(block_hash)
        elif kind == SNAP_REMOVED or kind == HOST_SNAP_REMOVED:
            if self._anchors.removed(stage_id, block_hash, kind == HOST_SNAP_REMOVED):
                self._recover(block_hash)

    def _resync(self, stage_id: int, held: tuple[tuple[int, int, int | None], ...]) -> None:
        """The stage's whole sets replace what was known of it: the difference is applied (what
        it gained first, so a block that only moved between its pool and host tier stays)."""
        for kind, block_hash, parent_hash in held:  # the pool's blocks parents first
            self._change(stage_id, kind, block_hash, parent_hash)
        now = {(kind, block_hash) for kind, block_hash, _ in held}
        had = [
            *((STORED, h) for h in self._held[stage_id]),
            *((HOST_STORED, h) for h in self._host[stage_id]),
            *self._anchors.held(stage_id),
        ]
        # each REMOVED kind is its STORED kind + 1
        gone = [(kind + 1, h) for kind, h in had if (kind, h) not in now]
        for kind, block_hash in gone:
            self._change(stage_id, kind, block_hash, None)

    def _whole(self, block_hash: int) -> bool:
        """Held on every stage (in its pool or host tier)."""
        return self._reach.get(block_hash) == self.num_stages

    def _recover(self, block_hash: int) -> None:
        """Hybrid: a block's holding or snapshots changed; the blocks whose way to an anchor
        changed are announced or withdrawn (Anchors.recover)."""
        if self.hybrid:
            self._anchors.recover(block_hash, self._whole, self._parent.__getitem__, self._settle)

    def _settle(self, block_hash: int) -> None:
        """A block's stages changed: announce it, withdraw it, or move it to its new medium."""
        medium, now = self._desired(block_hash), self._announced.get(block_hash)
        if medium == now:
            return
        if medium is None:
            self._withdraw(block_hash)
        elif now is None:
            self._announce(block_hash)
        else:  # it moved (a stage evicted it to its host tier, or loaded it back)
            self._announced[block_hash] = medium
            self._events.append(RemovedBlock(block_hash, now))
            parent, tokens = self._parent[block_hash], self._tokens[block_hash]
            self._events.append(StoredBlock(block_hash, parent, tokens, medium))

    def _announce(self, block_hash: int) -> None:
        """Announce a block held on every stage once its parent is, then the children that
        waited for it."""
        todo = [block_hash]
        while todo:
            block_hash = todo.pop()
            medium = self._desired(block_hash)
            if block_hash in self._announced or medium is None:
                continue
            parent = self._parent[block_hash]
            if parent is not None and parent not in self._announced:
                continue  # it comes with its parent
            tokens = self._tokens.get(block_hash)
            if tokens is None:
                self.num_without_tokens += 1
                continue
            self._announced[block_hash] = medium
            self._events.append(StoredBlock(block_hash, parent, tokens, medium))
            todo.extend(self._kids.get(block_hash, ()))

    def _withdraw(self, block_hash: int) -> None:
        """Withdraw an announced block, its announced descendants first (deepest first)."""
        order, i = [block_hash], 0
        while i < len(order):
            order.extend(k for k in self._kids.get(order[i], ()) if k in self._announced)
            i += 1
        for gone in reversed(order):
            self._events.append(RemovedBlock(gone, self._announced.pop(gone)))
            self._maybe_forget_tokens(gone)

    def _maybe_forget_tokens(self, block_hash: int) -> None:
        """Tokens nothing keeps any more go to the recent ones (the oldest of those go)."""
        if (
            block_hash in self._refs
            or self._holds(0, block_hash)
            or block_hash in self._announced
            or block_hash not in self._tokens
        ):
            return
        self._recent[block_hash] = self._tokens.pop(block_hash)
        while len(self._recent) > self.max_recent_blocks:
            self._recent.popitem(last=False)
