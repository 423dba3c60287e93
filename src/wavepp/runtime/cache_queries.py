"""How much of a prompt the pipeline holds on **all** of its stages right now: what a router
asks before it picks a replica (`wavepp route --routing cache`).

    queries = CacheQueries(channels, stage, num_stages, block_size, hybrid=False)
    views = queries.ask([token_ids, ...])      # one CachedView per prompt
    queries.close()                            # the stages' QUERY threads end

It is the round protocol's probe without the round: every stage answers with the hint a probe
gets (its longest prefix present, computed or pending, by the exponential probe and binary
search over chained block hashes; `StageServer.query`, remembering nothing), stage 0 here under
its lock, the others on their QUERY threads over a plane pair of their own (queries / answers),
so that a query waits for neither an admission round nor a wave. The prefix the pipeline could
reuse is the one every stage holds, agreed as admission agrees it (`agree_prefix`: the minimum,
at least one token left to compute, and on a hybrid model a snapshot boundary every stage has).

One query at a time crosses the planes (a lock; the caller's thread waits for it): a few
hundred microseconds on loopback, measured in docs/serving.md. Between the answer and the
request the caches may change; the request's own admission round is what decides its reuse.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

from wavepp.runtime.channels import PeerLostError, Shutdown
from wavepp.runtime.protocol import CacheAnswer, CacheQuery, EngineError
from wavepp.sched.admission import agree_prefix, tier_tokens
from wavepp.sched.request import Request
from wavepp.sched.stage_server import StageCounters


@dataclass(frozen=True)
class CachedView:
    num_tokens: int
    cached_tokens: int  # held on every stage: what a request would reuse if admitted now
    stage_cached_tokens: tuple[int, ...]  # each stage's own prefix (capped as the reuse is)
    stage_available_blocks: tuple[int, ...]  # each stage's blocks free or evictable now
    # of cached_tokens, where the stages hold them: (pool, host, store), the pool part the
    # prefix every stage has in its pool, the host part what every stage has in its pool or
    # host tier beyond it, the rest in the shared store
    tier_tokens: tuple[int, int, int] = (0, 0, 0)


@dataclass(frozen=True)
class StageCacheCounters:
    stage_id: int
    counters: StageCounters  # its cache and tiers since start
    capacity: object  # CapacityView now


class CacheQueries:
    def __init__(
        self,
        channels,
        stage,
        num_stages: int,
        block_size: int,
        hybrid: bool = False,
        block_changes=None,
    ):
        """`block_changes`: where the stages' block changes go (a KVEventsFeed: mark() before a
        query, apply() with its answers, under this object's lock); None: no KV cache events."""
        self.channels, self.stage = channels, stage
        self.num_stages, self.block_size, self.hybrid = num_stages, block_size, hybrid
        self.block_changes = block_changes
        self._lock = threading.Lock()
        self._next_id = 0
        self._closed = False

    def ask(self, token_lists) -> list[CachedView]:
        bs = self.block_size
        reqs = [Request.create(i, tokens, bs) for i, tokens in enumerate(token_lists)]
        answers = self._exchange(tuple(r.probe_item() for r in reqs))
        out = []
        for j, req in enumerate(reqs):
            hints = [a.hints[j] for a in answers]
            k = agree_prefix(req, hints, bs, hybrid=self.hybrid)
            reusable = req.max_reusable_blocks(bs)
            out.append(
                CachedView(
                    req.num_tokens,
                    k * bs,
                    tuple(min(h.num_blocks, reusable) * bs for h in hints),
                    tuple(a.capacity.num_free + a.capacity.num_evictable for a in answers),
                    tier_tokens(k * bs, hints, bs),
                )
            )
        return out

    def stage_counters(self) -> list[StageCacheCounters]:
        """Every stage's cache counters now (a query with no prompt: /metrics asks it)."""
        return [StageCacheCounters(a.stage_id, a.counters, a.capacity) for a in self._exchange(())]

    def poll(self) -> None:
        """A query of no prompt, for the stages' block changes alone (KV cache events)."""
        self._exchange(())

    @contextlib.contextmanager
    def held(self):
        """No query runs inside (a reset: no answer spans it, so no change of a pool it
        replaced arrives after the events were cleared)."""
        with self._lock:
            yield

    def _exchange(self, items: tuple) -> list[CacheAnswer]:
        """Every stage's answer to one query, stage 0's first; their block changes go to
        `block_changes` before the lock is let go (so in each stage's order)."""
        with self._lock:
            if self._closed:
                raise EngineError("the engine was shut down")
            query_id, self._next_id = self._next_id, self._next_id + 1
            sink = self.block_changes
            mark = sink.mark() if sink is not None else 0  # before stage 0's pool is drained
            try:
                for s in range(1, self.num_stages):
                    self.channels.send_obj(CacheQuery(query_id, items), s, "queries")
                answers = [CacheAnswer(query_id, 0, *self.stage.query(items))]
                for s in range(1, self.num_stages):
                    answer = self.channels.recv_obj(s, "answers")
                    if not isinstance(answer, CacheAnswer) or answer.query_id != query_id:
                        raise EngineError(f"stage {s} answered another cache query: {answer!r}")
                    answers.append(answer)
            except PeerLostError as err:
                raise EngineError(f"a stage did not answer the cache query: {err}") from None
            if sink is not None:
                sink.apply([(a.stage_id, a.block_changes) for a in answers], mark)
        return answers

    def close(self) -> None:
        """The stages' QUERY threads end (best effort: a stage that is gone is skipped)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for s in range(1, self.num_stages):
                try:
                    self.channels.send_obj(Shutdown(), s, "queries")
                except PeerLostError:
                    pass
