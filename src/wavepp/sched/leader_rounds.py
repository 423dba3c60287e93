"""The leader's side of an admission round (mixed into Leader, leader.py, whose state it uses):

    start_round(now)            probe: every stage's longest local prefix of the waiting requests
    advance_round(replies, now)   probe replies -> lease (the prefix every stage holds, agreed)
                                  lease replies -> admitted, or refused and requeued; the releases

The round's rules (what is agreed, who waits for a round, which failures count) are in
admission.py; this is the leader's bookkeeping around them.
"""

from __future__ import annotations

import collections

from wavepp.sched.admission import (
    AdmissionRound,
    RoundOutcome,
    RoundStep,
    agree_prefix,
    failures_by_request,
    waits_for_round,
)
from wavepp.sched.messages import LeaseItem, LeaseMsg, ProbeMsg, ReleaseMsg
from wavepp.sched.request import RequestState


class LeaderRounds:
    def start_round(self, now: float) -> RoundStep | None:
        """Open a round over the waiting requests (at most one round at a time): a ProbeMsg."""
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
        items = tuple(r.probe_item() for r in batch)
        return RoundStep(send=ProbeMsg(self.round.round_id, items))

    def advance_round(self, replies, now: float) -> RoundStep:
        """The replies of every stage to the round's last message: the next step."""
        phase = self._round_phase()
        if phase == "probe":
            return self._on_probe_replies(replies)
        return self._on_lease_replies(replies, now)

    def _on_probe_replies(self, replies) -> RoundStep:
        """Agree each request's prefix (min over stages); ask every stage to lease it and escrow
        room for the rest. A request sharing blocks beyond its agreed prefix with an earlier
        request of this round waits for the next round, where it reuses them as pending blocks
        (and pending snapshots) instead of computing them twice; on a hybrid model only if
        they reach a snapshot boundary (`waits_for_round`)."""
        rnd = self.round
        hints: dict[int, list] = collections.defaultdict(list)
        for reply in replies:
            for hint in reply.hints:
                hints[hint.request_id].append(hint)
        bs = self.config.block_size
        new_in_round: set[int] = set()
        ends_in_round: set[int] = (
            set()
        )  # hybrid: blocks ending at a request's last reusable boundary
        items, deferred = [], []
        for req in rnd.requests:
            if req.request_id in rnd.aborted:
                continue
            req_hints = hints[req.request_id]
            if len(req_hints) != self.config.num_stages:
                raise ValueError(
                    f"round {rnd.round_id}: request {req.request_id} has "
                    f"{len(req_hints)} hints for {self.config.num_stages} stages"
                )
            k = agree_prefix(req, req_hints, bs, hybrid=self.config.hybrid)
            interval = (
                max(h.snapshot_interval_blocks for h in req_hints) if self.config.hybrid else 0
            )
            if waits_for_round(req, k, new_in_round, ends_in_round, bs, interval):
                deferred.append(req)
                continue
            num_full = req.num_tokens // bs
            new_in_round.update(req.block_hashes[k:num_full])
            last_reusable = (req.num_tokens - 1) // bs
            if self.config.hybrid and last_reusable > k:
                ends_in_round.add(req.block_hashes[last_reusable - 1])
            req.num_cached_tokens = req.num_scheduled_tokens = req.num_computed_tokens = k * bs
            req.state = RequestState.LEASED
            rnd.leased.append(req)
            if (
                self.inflight.dead_until(req, k) > self._num_waves_done
            ):  # released, maybe before this lease
                rnd.tainted.add(req.request_id)
            items.append(LeaseItem(req.request_id, k, req.num_blocks(bs) - k))
        for req in reversed(deferred):
            req.state = RequestState.WAITING
            self.waiting.appendleft(req)
        rnd.requests = [r for r in rnd.requests if r not in deferred]
        rnd.phase = "lease"
        return RoundStep(send=LeaseMsg(rnd.round_id, tuple(items)))

    def _on_lease_replies(self, replies, now: float) -> RoundStep:
        """Admit the requests every stage leased, escrowed and committed; release the others
        everywhere (the ReleaseMsg goes out before the round ends)."""
        rnd = self.round
        for reply in replies:
            if reply.capacity is not None:
                self.stage_capacity[reply.stage_id] = reply.capacity
        failed = failures_by_request(replies, self.config.num_stages)
        bs = self.config.block_size
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
            k = req.num_cached_tokens // bs
            dead = self.inflight.dead_until(req, k)
            if dead > self._num_waves_done or req.request_id in rnd.tainted:
                # it leased blocks a withdrawn request will not compute: retry once the release ran
                release.append(req.request_id)
                self._requeue(req, max(dead, self._num_waves_done), front=True)
                continue
            req.state = RequestState.ADMITTED
            req.admitted_time = now
            req.dependencies = self.inflight.dependencies(req, k)
            self.inflight.register(req, k)
            self.plannable.append(req)
            admitted.append(req)
        for req in rnd.requests:
            if req.state == RequestState.PROPOSED and req.request_id in rnd.aborted:
                self._finish(req, RequestState.ABORTED, "aborted", now)
        retried = tuple(r for r in rnd.leased if r.state == RequestState.WAITING)
        failed_reqs = tuple(r for r in rnd.leased if r.state == RequestState.FAILED)
        self.round = None
        latency = now - rnd.start_time
        # the planner's prediction of a running round's end: a moving average of the last rounds
        self._round_latency_s = (
            latency if self._round_latency_s is None else 0.5 * (self._round_latency_s + latency)
        )
        outcome = RoundOutcome(rnd.round_id, tuple(admitted), failed_reqs, retried, latency)
        return RoundStep(release=_release(release), outcome=outcome)

    # ---- execution ---------------------------------------------------------------------------


def _release(request_ids: list[int]) -> ReleaseMsg | None:
    return ReleaseMsg(tuple(request_ids)) if request_ids else None
