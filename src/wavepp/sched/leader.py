"""The leader (rank 0): admits requests through rounds with every stage and plans waves.

Drivers (the runtime's two loops, the simulator, the tests) call it like this (the round's
state and steps are its `rounds`, a LeaderRounds: leader_rounds.py):

    admission (WAVE, or LOOP between waves under lockstep)    execution (LOOP)
      one round: sched.rounds.round_messages(leader, now)      wave = leader.plan_wave(now)
        start_round -> advance_round -> ... -> RoundOutcome    ... stages run it ...
                                                               leader.on_wave_result(res, now)
      finished = leader.take_finished()    # every request that ended, exactly once

Pure logic: no threads, no clocks of its own (`now` comes from the driver), no tensors. The
runtime holds a lock around calls since WAVE and LOOP both call it.

State is bounded by the work outstanding: a request leaves `requests` when it ends and is
handed to the driver once by `take_finished()`.
"""

from __future__ import annotations

import itertools

from wavepp.cache import CapacityView
from wavepp.sched.admission import AdmissionRound, RoundStep
from wavepp.sched.inflight import InflightBlocks
from wavepp.sched.leader_config import LeaderConfig
from wavepp.sched.leader_rounds import LeaderRounds
from wavepp.sched.messages import PromptLogprobs, TokenResult, Wave, WaveResult
from wavepp.sched.planners import Admitting, Planner
from wavepp.sched.request import Request, RequestState
from wavepp.sched.waiting import WaitingQueue

# waiting requests the planner is told of (Leader._admitting)
_ADMITTING_SCAN = 256


class Leader:
    def __init__(self, config: LeaderConfig, planner: Planner):
        self.config = config
        self.planner = planner
        self.requests: dict[int, Request] = {}  # every request that has not ended
        self.waiting = WaitingQueue(config.scheduling_policy, config.priority_aging_s)
        self.plannable: list[Request] = []  # admitted or running, in admission order
        self.rounds = LeaderRounds(config.num_stages, config.block_size, config.hybrid)
        self.waves_in_flight: dict[int, Wave] = {}
        self.inflight = InflightBlocks(config.block_size)
        self._finished: list[Request] = []  # ended, not yet taken by the driver
        self._pending_releases: list[int] = []  # withdrawn requests: released with the next wave
        self._retry_after_wave: dict[int, int] = {}  # request id -> waves that must finish first
        self._num_waves_done = 0
        self._next_wave_id = 0
        self._next_seq = 0  # arrival order

    # ---- requests ----------------------------------------------------------------------------

    def add_request(
        self,
        request_id: int,
        token_ids,
        now: float = 0.0,
        *,
        logprob_start: int | None = None,
        export_id: str | None = None,
        priority: int = 0,
    ) -> Request:
        """Hash the prompt and queue it. A prompt that no stage could ever hold, or longer than
        the model's positions, fails at once (it is then among `take_finished()`).
        `logprob_start`: compute positions from there on (no reuse past its block) and return
        the logprob of each next prompt token (Request.prompt_logprobs). `export_id`: every
        stage writes its layers' KV of the prompt under this id after the last chunk ran there.
        `priority`: lower is more urgent, under the priority policy (sched/waiting.py)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id} is already in use")
        if logprob_start is not None and not 0 <= logprob_start < len(token_ids):
            raise ValueError(
                f"logprob_start {logprob_start} is outside the prompt [0, {len(token_ids)})"
            )
        req = Request.create(request_id, token_ids, self.config.block_size, arrival_time=now)
        req.logprob_start = logprob_start
        req.export_id = export_id
        req.priority = priority
        req.seq, self._next_seq = self._next_seq, self._next_seq + 1
        self.requests[request_id] = req
        bs = self.config.block_size
        smallest = min(self.config.stage_num_blocks) if self.config.stage_num_blocks else None
        longest = self.config.max_prompt_tokens
        if longest is not None and req.num_tokens > longest:
            self._fail(
                req,
                f"the prompt has {req.num_tokens} tokens; the model takes at most "
                f"{longest} (max_position_embeddings)",
                now,
            )
        elif smallest is not None and req.num_blocks(bs) > smallest:
            self._fail(
                req,
                f"the prompt needs {req.num_blocks(bs)} blocks of {bs} tokens; the "
                f"smallest stage holds {smallest}",
                now,
            )
        else:
            self.waiting.push(req)
        return req

    def abort(self, request_id: int, now: float = 0.0) -> None:
        """Abort a request at any step of its life; unknown or ended ids are ignored. A request
        in a round ends at the round's next step; an admitted one ends now, and the stages free
        what it holds after the next wave (which carries the release)."""
        req = self.requests.get(request_id)
        if req is None:
            return
        if req.state == RequestState.WAITING:
            self.waiting.remove(req)
            self._finish(req, RequestState.ABORTED, "aborted", now)
        elif self.round is not None and req in self.round.requests:
            self.round.aborted.add(request_id)
        else:  # admitted or running
            self._withdraw(req)
            self._finish(req, RequestState.ABORTED, "aborted", now)

    def take_finished(self) -> list[Request]:
        """The requests that ended (done, failed, aborted) since the last call, each once."""
        out, self._finished = self._finished, []
        return out

    # ---- admission ---------------------------------------------------------------------------

    @property
    def round(self) -> AdmissionRound | None:
        """The admission round open now, if any (its state: `rounds`)."""
        return self.rounds.round

    @property
    def stage_capacity(self) -> list[CapacityView | None]:
        """Each stage's blocks by state, as its last CommitReply reported them (for metrics)."""
        return self.rounds.stage_capacity

    @property
    def has_waiting(self) -> bool:
        return any(self._retry_ready(r) for r in self.waiting)

    def start_round(self, now: float) -> RoundStep | None:
        """Open a round over the waiting requests ready for one (at most `max_round_requests`;
        at most one round at a time): the step that sends its ProbeMsg, or None."""
        if self.round is not None:
            return None
        batch = self.waiting.take(self.config.max_round_requests, self._retry_ready, now)
        if not batch:
            return None
        for req in batch:
            if req.round_time is None:
                req.round_time = now
        return self.rounds.open(batch, now)

    def advance_round(self, replies, now: float) -> RoundStep:
        """The replies of every stage to the round's last message: the next step."""
        if self.rounds.phase == "probe":
            step, deferred = self.rounds.agree(replies, self._leased_dead)
            for req in deferred:  # back to their places
                self.waiting.push(req)
            return step
        return self._on_lease_replies(replies, now)

    def plan_wave(self, now: float) -> Wave | None:
        """The next wave, or None if the ring is full or there is nothing to send."""
        if len(self.waves_in_flight) >= self.config.waves_in_flight_cap:
            return None
        ready = [
            r for r in self.plannable if r.num_unscheduled_tokens > 0 and self._deps_dispatched(r)
        ]
        if self.config.serial_chunks:
            ready = [r for r in ready if r.num_computed_tokens == r.num_scheduled_tokens]
        # the waiting queue's order: arrival (fcfs), or priority with aging, then arrival
        ready.sort(key=lambda r: self.waiting.key(r, now))
        chunks = self.planner.plan(ready, self._admitting(now)) if ready else []
        if not chunks and not self._pending_releases:
            return None
        bs = self.config.block_size
        for chunk in chunks:
            req = self.requests[chunk.request_id]
            if chunk.start != req.num_scheduled_tokens:
                raise AssertionError(
                    f"planner produced {chunk} but request is scheduled to "
                    f"{req.num_scheduled_tokens}"
                )
            req.state = RequestState.RUNNING
            if req.dispatch_time is None:
                req.dispatch_time = now
            req.num_scheduled_tokens = chunk.end
            self.inflight.dispatched(req, chunk.start // bs, chunk.end // bs)
        wave = Wave(self._next_wave_id, tuple(chunks), tuple(self._pending_releases))
        self._next_wave_id += 1
        self._pending_releases.clear()
        self.waves_in_flight[wave.wave_id] = wave
        return wave

    def _admitting(self, now: float) -> Admitting:
        """(cached, new) tokens of the requests in the round and the first `_ADMITTING_SCAN`
        waiting for one; cached is 0 until the round agrees the prefix (an upper bound on their
        work). The planner's share saturates at its cap long before a deep queue ends, so a
        long queue is not walked on every wave. The round's end is predicted from the last
        rounds' latency (none yet: never soon)."""
        rnd = self.round
        pending = list(rnd.requests) if rnd is not None else []
        in_round = len(pending)
        pending.extend(itertools.islice(self.waiting, _ADMITTING_SCAN))
        items = [
            (r.num_cached_tokens, r.num_tokens - r.num_cached_tokens)
            if r.state == RequestState.LEASED
            else (0, r.num_tokens)
            for r in pending
        ]
        return Admitting(items, in_round, self.rounds.seconds_left(now))

    def on_wave_result(self, result: WaveResult, now: float) -> list[Request]:
        """A wave came back from the last stage; returns the requests it finished (they are
        also among `take_finished()`). Each finished request carries its `result`."""
        wave = self.waves_in_flight.pop(result.wave_id)
        self._num_waves_done += 1
        self.inflight.on_wave_done(self._num_waves_done)
        if result.stage_seconds and wave.chunks:
            self.planner.observe(
                [(c.start, c.num_tokens) for c in wave.chunks], max(result.stage_seconds)
            )
        tokens = {t.request_id: t for t in result.tokens if isinstance(t, TokenResult)}
        prompt_logprobs = {t.request_id: t for t in result.tokens if isinstance(t, PromptLogprobs)}
        done = []
        for chunk in wave.chunks:
            req = self.requests.get(chunk.request_id)
            if req is None:  # aborted while this chunk was in flight
                continue
            req.num_computed_tokens = chunk.end
            if chunk.logprob_start is not None:
                if chunk.request_id not in prompt_logprobs:
                    raise ValueError(
                        f"wave {wave.wave_id}: no prompt logprobs for request {chunk.request_id}"
                    )
                req.prompt_logprobs.append(prompt_logprobs[chunk.request_id])
            if chunk.is_last:
                if chunk.request_id not in tokens:
                    raise ValueError(
                        f"wave {wave.wave_id}: no first token for request {chunk.request_id}"
                    )
                req.result = tokens[chunk.request_id]
                self.plannable.remove(req)
                self._finish(req, RequestState.DONE, None, now)
                done.append(req)
        return done

    @property
    def idle(self) -> bool:
        """Nothing waiting, in a round, planned or in flight."""
        return (
            not self.waiting
            and self.round is None
            and not self.plannable
            and not self.waves_in_flight
            and not self._pending_releases
        )

    def state_size(self) -> int:
        """Entries of every per-request structure: bounded by the requests outstanding."""
        return (
            len(self.requests)
            + len(self.waiting)
            + len(self.plannable)
            + len(self._finished)
            + len(self._pending_releases)
            + len(self._retry_after_wave)
            + len(self.inflight)
            + len(self.waves_in_flight)
        )

    # ---- internals ---------------------------------------------------------------------------

    def _on_lease_replies(self, replies, now: float) -> RoundStep:
        """Admit the requests every stage leased, escrowed and committed; release the others
        everywhere (the ReleaseMsg goes out before the round ends)."""
        rnd = self.round
        assert rnd is not None, "no admission round is open"
        failed = self.rounds.commits(replies)
        admitted, release = [], []
        for req in rnd.leased:
            if req.request_id in rnd.aborted:
                release.append(req.request_id)
                self._finish(req, RequestState.ABORTED, "aborted", now)
                continue
            if req.request_id in failed:
                release.append(req.request_id)
                self._not_admitted(req, failed[req.request_id], now)
                continue
            dead = self.inflight.dead_until(req, req.num_cached_tokens // self.config.block_size)
            if dead > self._num_waves_done or req.request_id in rnd.tainted:
                # it leased blocks a withdrawn request will not compute: retry once the release ran
                release.append(req.request_id)
                self._requeue(req, max(dead, self._num_waves_done))
                continue
            self._admit(req, now)
            admitted.append(req)
        for req in rnd.requests:
            if req.state == RequestState.PROPOSED and req.request_id in rnd.aborted:
                self._finish(req, RequestState.ABORTED, "aborted", now)
        return self.rounds.close(now, admitted, release)

    def _admit(self, req: Request, now: float) -> None:
        """A leased request every stage committed: it waits for its chunks to be planned."""
        k = req.num_cached_tokens // self.config.block_size
        req.state = RequestState.ADMITTED
        req.admitted_time = now
        req.dependencies = self.inflight.dependencies(req, k)
        self.inflight.register(req, k)
        self.plannable.append(req)

    def _leased_dead(self, req: Request, k: int) -> bool:
        """Blocks of req's first k, which a withdrawn request was to compute, may be released
        after a lease of them now (not every wave before that release has finished)."""
        return self.inflight.dead_until(req, k) > self._num_waves_done

    def _retry_ready(self, req: Request) -> bool:
        return self._retry_after_wave.get(req.request_id, 0) <= self._num_waves_done

    def _deps_dispatched(self, req: Request) -> bool:
        """Every owner of req's leased blocks dispatched them. An owner that ended is done (an
        owner that left undispatched sent its dependents back to waiting when it left)."""
        deps = req.dependencies
        if deps and all(
            (o := self.requests.get(d.owner_id)) is None or o.num_scheduled_tokens >= d.num_tokens
            for d in deps
        ):
            req.dependencies = []
        return not req.dependencies

    def _not_admitted(self, req: Request, reason: str, now: float) -> None:
        """Retry after capacity changes (a wave finishes, or releases go out with the next
        one). On an idle pipeline nothing will change: retry once at once (its hint may have
        raced an eviction), then fail."""
        holders = self.round.requests if self.round else ()
        busy = (
            self.plannable
            or self.waves_in_flight
            or self._pending_releases
            or any(r is not req and r.state is RequestState.LEASED for r in holders)
        )
        if busy:
            req.num_idle_failures = 0
            self._requeue(req, self._num_waves_done + 1)
            return
        req.num_idle_failures += 1
        if req.num_idle_failures >= 2:
            self._fail(req, f"cannot be admitted on an idle pipeline: {reason}", now)
        else:
            self._requeue(req, self._num_waves_done)

    def _requeue(self, req: Request, retry_after_wave: int) -> None:
        """Back to waiting at its place, holding nothing; it enters a round once
        `retry_after_wave` waves have finished."""
        req.reset_progress()
        req.state = RequestState.WAITING
        self._retry_after_wave[req.request_id] = retry_after_wave
        self.waiting.push(req)

    def _withdraw(self, req: Request) -> None:
        """An admitted request leaves execution: the stages release it with the next wave, the
        blocks it has not dispatched are dead until then, and every request that waits for
        them goes back to waiting (released with the same wave), down the whole chain."""
        self.plannable.remove(req)
        if req.num_scheduled_tokens < req.num_tokens:
            self._pending_releases.append(req.request_id)
        release_done = self._next_wave_id + 1  # the release rides on the next wave
        self.rounds.taint(self.inflight.withdraw(req, release_done))  # its leases may hold them
        for dep in list(self.plannable):
            if dep in self.plannable and any(
                d.owner_id == req.request_id and req.num_scheduled_tokens < d.num_tokens
                for d in dep.dependencies
            ):
                self._withdraw(dep)
                self._requeue(dep, release_done)

    def _fail(self, req: Request, reason: str, now: float) -> None:
        self._finish(req, RequestState.FAILED, reason, now)

    def _finish(self, req: Request, state: RequestState, reason: str | None, now: float) -> None:
        self._retry_after_wave.pop(req.request_id, None)
        self.requests.pop(req.request_id, None)
        req.state = state
        req.failure = reason
        req.finish_time = now
        self._finished.append(req)
