"""The leader (rank 0): admits requests through rounds with every stage and plans waves.

Drivers (the runtime's two loops, the simulator, the test harness) call it like this:

    admission (WAVE, or LOOP between waves under lockstep)    execution (LOOP)
      msg = leader.start_round(now)        # ProbeMsg            wave = leader.plan_wave(now)
      msg = leader.on_probe_replies(rs)    # LeaseMsg            ... stages run it ...
      msg, rel = leader.on_lease_replies(rs)   # CommitMsg       leader.on_wave_result(res, now)
      out = leader.on_commit_replies(rs, now)  # RoundOutcome
      (any ReleaseMsg returned goes to every stage)

Pure logic: no threads, no clocks of its own (`now` comes from the driver), no tensors. The
runtime holds a lock around calls since WAVE and LOOP both call it.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from wavepp.sched.admission import AdmissionRound, RoundOutcome, agree_prefix, failures_by_request
from wavepp.sched.messages import (
    CommitMsg, LeaseItem, LeaseMsg, ProbeItem, ProbeMsg, ReleaseMsg, TokenResult, Wave, WaveResult)
from wavepp.sched.planner import Planner
from wavepp.sched.request import Dependency, Request, RequestState


@dataclass(frozen=True)
class LeaderConfig:
    num_stages: int
    block_size: int = 16
    max_waves_in_flight: int | None = None    # default 2 * num_stages (the execution ring)
    max_round_requests: int = 64
    stage_num_blocks: tuple[int, ...] | None = None   # to fail prompts no stage could ever hold
    hybrid: bool = False

    def __post_init__(self) -> None:
        if self.num_stages <= 0:
            raise ValueError(f"LeaderConfig.num_stages must be positive, got {self.num_stages}")
        if self.block_size <= 0:
            raise ValueError(f"LeaderConfig.block_size must be positive, got {self.block_size}")
        if self.max_waves_in_flight is not None and self.max_waves_in_flight <= 0:
            raise ValueError("LeaderConfig.max_waves_in_flight must be positive")
        if self.max_round_requests <= 0:
            raise ValueError("LeaderConfig.max_round_requests must be positive")
        if self.stage_num_blocks is not None and len(self.stage_num_blocks) != self.num_stages:
            raise ValueError(f"LeaderConfig.stage_num_blocks has {len(self.stage_num_blocks)} "
                             f"entries for {self.num_stages} stages")

    @property
    def waves_in_flight_cap(self) -> int:
        return self.max_waves_in_flight or 2 * self.num_stages


class Leader:
    def __init__(self, config: LeaderConfig, planner: Planner):
        self.config = config
        self.planner = planner
        self.requests: dict[int, Request] = {}
        self.results: dict[int, TokenResult] = {}
        self.waiting: collections.deque[Request] = collections.deque()
        self.plannable: list[Request] = []          # admitted or running, in admission order
        self.round: AdmissionRound | None = None
        self.waves_in_flight: dict[int, Wave] = {}
        self.round_latencies: list[float] = []
        # hash -> {owner id: tokens through the block}: admitted requests that compute the block
        # and have not dispatched it yet. Stages dedup differently (a block cached on one stage
        # is recomputed for another), so a block may have several owners.
        self._pending_owners: dict[int, dict[int, int]] = {}
        self._pending_releases: list[int] = []
        # hash -> number of waves that must finish before the block is gone from every stage:
        # blocks an aborted owner never dispatched. A request in a round that leased one cannot
        # be admitted; it retries once the release has run.
        self._dead_blocks: dict[int, int] = {}
        self._retry_after_wave: dict[int, int] = {}    # request id -> waves that must finish first
        self._num_waves_done = 0
        self._next_round_id = 0
        self._next_wave_id = 0

    # ---- requests ----------------------------------------------------------------------------

    def add_request(self, request_id: int, token_ids, now: float = 0.0) -> Request:
        """Hash the prompt and queue it. A prompt that no stage could ever hold fails at once."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id} is already in use")
        req = Request.create(request_id, token_ids, self.config.block_size, arrival_time=now)
        self.requests[request_id] = req
        smallest = min(self.config.stage_num_blocks) if self.config.stage_num_blocks else None
        if smallest is not None and req.num_blocks(self.config.block_size) > smallest:
            self._fail(req, f"the prompt needs {req.num_blocks(self.config.block_size)} blocks of "
                            f"{self.config.block_size} tokens; the smallest stage holds {smallest}", now)
        else:
            self.waiting.append(req)
        return req

    def abort(self, request_id: int, now: float = 0.0) -> ReleaseMsg | None:
        """Abort a request at any step. Returns a ReleaseMsg for the rounds plane when the request
        holds resources only through admission; an admitted request is released by the stages
        after the next wave (its header carries the release)."""
        req = self.requests.get(request_id)
        if req is None:
            raise KeyError(f"unknown request id {request_id}")
        if req.state.finished:
            return None
        if req.state == RequestState.WAITING:
            self.waiting.remove(req)
            self._finish(req, RequestState.ABORTED, "aborted", now)
            return None
        if self.round is not None and req in self.round.requests:
            self.round.aborted.add(request_id)   # the round releases it at its next step
            return None
        # admitted or running
        self.plannable.remove(req)
        if req.num_scheduled_tokens < req.num_tokens:
            self._pending_releases.append(request_id)
        self._finish(req, RequestState.ABORTED, "aborted", now)
        self._requeue_dependents(req, now)
        return None

    # ---- admission ---------------------------------------------------------------------------

    @property
    def has_waiting(self) -> bool:
        return any(self._retry_ready(r) for r in self.waiting)

    def start_round(self, now: float) -> ProbeMsg | None:
        """Open a round over the waiting requests (at most one round at a time)."""
        if self.round is not None:
            return None
        batch, rest = [], collections.deque()
        while self.waiting and len(batch) < self.config.max_round_requests:
            req = self.waiting.popleft()
            (batch if self._retry_ready(req) else rest).append(req)
        self.waiting.extendleft(reversed(rest))
        if not batch:
            return None
        for req in batch:
            req.state = RequestState.PROPOSED
            req.num_rounds += 1
        self.round = AdmissionRound(self._next_round_id, batch, now)
        self._next_round_id += 1
        items = tuple(ProbeItem(r.request_id, tuple(r.block_hashes), r.num_tokens) for r in batch)
        return ProbeMsg(self.round.round_id, items)

    def on_probe_replies(self, replies) -> LeaseMsg:
        """Agree each request's prefix (min over stages); ask every stage to lease it and escrow
        room for the rest. A request sharing blocks beyond its agreed prefix with an earlier
        request of this round waits for the next round, where it reuses them as pending blocks
        instead of computing them twice."""
        rnd = self._round("probe")
        hints: dict[int, list] = collections.defaultdict(list)
        for reply in replies:
            for hint in reply.hints:
                hints[hint.request_id].append(hint)
        bs = self.config.block_size
        new_in_round: set[int] = set()
        items, deferred = [], []
        for req in rnd.requests:
            if req.request_id in rnd.aborted:
                continue
            if len(hints[req.request_id]) != self.config.num_stages:
                raise ValueError(f"round {rnd.round_id}: request {req.request_id} has "
                                 f"{len(hints[req.request_id])} hints for {self.config.num_stages} stages")
            k = agree_prefix(req, hints[req.request_id], bs, hybrid=self.config.hybrid)
            num_full = req.num_tokens // bs
            if k < num_full and req.block_hashes[k] in new_in_round:
                deferred.append(req)
                continue
            new_in_round.update(req.block_hashes[k:num_full])
            req.num_cached_tokens = req.num_scheduled_tokens = req.num_computed_tokens = k * bs
            req.state = RequestState.LEASED
            rnd.leased.append(req)
            items.append(LeaseItem(req.request_id, k, req.num_blocks(bs) - k))
        for req in reversed(deferred):
            req.state = RequestState.WAITING
            self.waiting.appendleft(req)
        rnd.requests = [r for r in rnd.requests if r not in deferred]
        rnd.phase = "lease"
        return LeaseMsg(rnd.round_id, tuple(items))

    def on_lease_replies(self, replies, now: float = 0.0) -> tuple[CommitMsg, ReleaseMsg | None]:
        """Commit the requests every stage leased and escrowed; release the others everywhere."""
        rnd = self._round("lease")
        failed = failures_by_request(replies, self.config.num_stages)
        commit, release = [], []
        for req in rnd.leased:
            if req.request_id in rnd.aborted:
                release.append(req.request_id)
                self._finish(req, RequestState.ABORTED, "aborted", now)
            elif req.request_id in failed:
                release.append(req.request_id)
                self._not_admitted(req, failed[req.request_id], now)
            else:
                req.state = RequestState.ESCROWED
                rnd.escrowed.append(req)
                commit.append(req.request_id)
        rnd.phase = "commit"
        return CommitMsg(rnd.round_id, tuple(commit)), (ReleaseMsg(tuple(release)) if release else None)

    def on_commit_replies(self, replies, now: float) -> tuple[RoundOutcome, ReleaseMsg | None]:
        """Admit the requests every stage committed; release the others everywhere."""
        rnd = self._round("commit")
        failed = failures_by_request(replies, self.config.num_stages)
        bs = self.config.block_size
        admitted, release = [], []
        for req in rnd.escrowed:
            if req.request_id in rnd.aborted:
                release.append(req.request_id)
                self._finish(req, RequestState.ABORTED, "aborted", now)
                continue
            if req.request_id in failed:
                release.append(req.request_id)
                self._not_admitted(req, failed[req.request_id], now)
                continue
            k = req.num_cached_tokens // bs
            dead = max((self._dead_blocks.get(h, 0) for h in req.block_hashes[:k]), default=0)
            if dead > self._num_waves_done:   # it leased blocks an aborted request will not compute
                release.append(req.request_id)
                self._requeue(req, dead, front=True)
                continue
            req.state = RequestState.ADMITTED
            req.admitted_time = now
            needs: dict[int, int] = {}
            for h in req.block_hashes[:k]:
                for owner_id, num_tokens in self._pending_owners.get(h, {}).items():
                    needs[owner_id] = max(needs.get(owner_id, 0), num_tokens)
            req.dependencies = [Dependency(o, t) for o, t in sorted(needs.items())]
            for j in range(k, req.num_tokens // bs):
                self._pending_owners.setdefault(req.block_hashes[j], {})[req.request_id] = (j + 1) * bs
            self.plannable.append(req)
            admitted.append(req)
        for req in rnd.requests:
            if req.state == RequestState.PROPOSED and req.request_id in rnd.aborted:
                self._finish(req, RequestState.ABORTED, "aborted", now)
        latency = now - rnd.start_time
        self.round_latencies.append(latency)
        retried = tuple(r for r in rnd.leased if r.state == RequestState.WAITING)
        failed_reqs = tuple(r for r in rnd.leased if r.state == RequestState.FAILED)
        self.round = None
        outcome = RoundOutcome(rnd.round_id, tuple(admitted), failed_reqs, retried, latency)
        return outcome, (ReleaseMsg(tuple(release)) if release else None)

    # ---- execution ---------------------------------------------------------------------------

    def plan_wave(self, now: float) -> Wave | None:
        """The next wave, or None if the ring is full or nothing is plannable."""
        if len(self.waves_in_flight) >= self.config.waves_in_flight_cap:
            return None
        ready = [r for r in self.plannable if r.num_unscheduled_tokens > 0 and self._deps_dispatched(r)]
        chunks = self.planner.plan(ready) if ready else []
        if not chunks and not self._pending_releases:
            return None
        bs = self.config.block_size
        for chunk in chunks:
            req = self.requests[chunk.request_id]
            if chunk.start != req.num_scheduled_tokens:
                raise AssertionError(f"planner produced {chunk} but request is scheduled to "
                                     f"{req.num_scheduled_tokens}")
            if req.first_dispatch_time is None:
                req.first_dispatch_time = now
            req.state = RequestState.RUNNING
            req.num_scheduled_tokens = chunk.end
            for j in range(chunk.start // bs, chunk.end // bs):
                self._drop_owner(req.block_hashes[j], req.request_id)
        wave = Wave(self._next_wave_id, tuple(chunks), tuple(self._pending_releases))
        self._next_wave_id += 1
        self._pending_releases.clear()
        self.waves_in_flight[wave.wave_id] = wave
        return wave

    def on_wave_result(self, result: WaveResult, now: float) -> list[Request]:
        """A wave came back from the last stage; returns the requests it finished."""
        wave = self.waves_in_flight.pop(result.wave_id)
        self._num_waves_done += 1
        if self._dead_blocks:
            self._dead_blocks = {h: n for h, n in self._dead_blocks.items() if n > self._num_waves_done}
        if result.stage_seconds and wave.chunks:
            self.planner.observe([(c.start, c.num_tokens) for c in wave.chunks], max(result.stage_seconds))
        tokens = {t.request_id: t for t in result.tokens}
        done = []
        for chunk in wave.chunks:
            req = self.requests[chunk.request_id]
            if req.state.finished:
                continue
            req.num_computed_tokens = chunk.end
            if chunk.is_last:
                if chunk.request_id not in tokens:
                    raise ValueError(f"wave {wave.wave_id}: no first token for request {chunk.request_id}")
                self.results[req.request_id] = tokens[chunk.request_id]
                self.plannable.remove(req)
                self._finish(req, RequestState.DONE, None, now)
                done.append(req)
        return done

    @property
    def idle(self) -> bool:
        """Nothing waiting, in a round, planned or in flight."""
        return (not self.waiting and self.round is None and not self.plannable
                and not self.waves_in_flight and not self._pending_releases)

    # ---- internals ---------------------------------------------------------------------------

    def _round(self, phase: str) -> AdmissionRound:
        if self.round is None or self.round.phase != phase:
            raise RuntimeError(f"no admission round in phase {phase!r} "
                               f"(round: {self.round and self.round.phase})")
        return self.round

    def _retry_ready(self, req: Request) -> bool:
        return self._retry_after_wave.get(req.request_id, 0) <= self._num_waves_done

    def _deps_dispatched(self, req: Request) -> bool:
        deps = req.dependencies
        if deps and all(self.requests[d.owner_id].num_scheduled_tokens >= d.num_tokens for d in deps):
            req.dependencies = []
        return not req.dependencies

    def _not_admitted(self, req: Request, reason: str, now: float) -> None:
        """Retry after capacity changes (a wave finishes). On an idle pipeline nothing will
        change: retry once at once (its hint may have raced an eviction), then fail."""
        req.reset_progress()
        holders = self.round.requests if self.round else ()
        busy = self.plannable or self.waves_in_flight or any(
            r is not req and r.state in (RequestState.LEASED, RequestState.ESCROWED) for r in holders)
        if busy:
            req.num_idle_failures = 0
            self._requeue(req, self._num_waves_done + 1, front=False)
            return
        req.num_idle_failures += 1
        if req.num_idle_failures >= 2:
            self._fail(req, f"cannot be admitted on an idle pipeline: {reason}", now)
        else:
            self._requeue(req, self._num_waves_done, front=False)

    def _requeue(self, req: Request, retry_after_wave: int, *, front: bool) -> None:
        """Back to waiting, holding nothing; it enters a round once `retry_after_wave` waves
        have finished."""
        req.reset_progress()
        req.state = RequestState.WAITING
        self._retry_after_wave[req.request_id] = retry_after_wave
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def _requeue_dependents(self, owner: Request, now: float) -> None:
        """Requests that leased blocks `owner` had not yet dispatched go back to waiting; their
        holds are released with the next wave, and they re-enter a round after it."""
        for req in list(self.plannable):
            if any(d.owner_id == owner.request_id and owner.num_scheduled_tokens < d.num_tokens
                   for d in req.dependencies):
                self.plannable.remove(req)
                self._pending_releases.append(req.request_id)
                self._requeue(req, self._next_wave_id + 1, front=True)
        bs = self.config.block_size
        release_done = self._next_wave_id + 1    # the release rides on the next wave
        for j in range(owner.num_scheduled_tokens // bs, owner.num_tokens // bs):
            h = owner.block_hashes[j]
            self._drop_owner(h, owner.request_id)
            self._dead_blocks[h] = max(self._dead_blocks.get(h, 0), release_done)

    def _drop_owner(self, block_hash: int, owner_id: int) -> None:
        owners = self._pending_owners.get(block_hash)
        if owners is not None and owners.pop(owner_id, None) is not None and not owners:
            del self._pending_owners[block_hash]

    def _fail(self, req: Request, reason: str, now: float) -> None:
        self._finish(req, RequestState.FAILED, reason, now)

    def _finish(self, req: Request, state: RequestState, reason: str | None, now: float) -> None:
        self._retry_after_wave.pop(req.request_id, None)
        req.state = state
        req.failure = reason
        req.finish_time = now
