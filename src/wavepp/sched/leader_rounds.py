"""The leader's admission rounds: the open round, the round ids, what the rounds learned.

`Leader` (leader.py) holds one `LeaderRounds` and calls it at each step of a round:

    open(batch, now)               the waiting requests picked -> ProbeMsg (every stage's
                                     longest local prefix of each)
    agree(replies, is_dead)        probe replies -> LeaseMsg (the prefix every stage holds),
                                     and the requests deferred to the next round
    commits(replies)               lease replies -> which requests some stage refused; every
                                     stage's capacity noted
    close(now, admitted, release)  the round is over -> its RoundOutcome, and its releases

Between `commits` and `close` the leader decides each leased request's fate (admitted, retried,
failed), since that moves its own queues. The round's rules (what is agreed, who waits for a
round, which failures count) are in admission.py. Pure Python: `now` is passed in.
"""

from __future__ import annotations

import collections
import math
from typing import Callable

from wavepp.cache import CapacityView
from wavepp.sched.admission import (
    AdmissionRound,
    RoundOutcome,
    RoundStep,
    agree_prefix,
    failures_by_request,
    waits_for_round,
)
from wavepp.sched.messages import LeaseItem, LeaseMsg, ProbeMsg, ReleaseMsg
from wavepp.sched.request import Request, RequestState


class LeaderRounds:
    def __init__(self, num_stages: int, block_size: int, hybrid: bool):
        self.num_stages = num_stages
        self.block_size = block_size
        self.hybrid = hybrid
        self.round: AdmissionRound | None = None  # at most one round is open
        # each stage's blocks by state, as its last CommitReply reported them (for metrics)
        self.stage_capacity: list[CapacityView | None] = [None] * num_stages
        self._latency_s: float | None = None  # moving average of the last rounds' latency
        self._next_round_id = 0

    @property
    def phase(self) -> str:
        """The open round's phase ("probe" or "lease"); RuntimeError if none is open."""
        if self.round is None:
            raise RuntimeError("no admission round is open")
        return self.round.phase

    def open(self, batch: list[Request], now: float) -> RoundStep:
        """Open a round over `batch` (none may be open): each request becomes PROPOSED and
        counts one more round. Returns the step that sends the ProbeMsg."""
        assert self.round is None, "an admission round is already open"
        for req in batch:
            req.state = RequestState.PROPOSED
            req.num_rounds += 1
        self.round = AdmissionRound(self._next_round_id, batch, now)
        self._next_round_id += 1
        items = tuple(r.probe_item() for r in batch)
        return RoundStep(send=ProbeMsg(self.round.round_id, items))

    def agree(
        self, replies, is_dead: Callable[[Request, int], bool]
    ) -> tuple[RoundStep, list[Request]]:
        """Agree each request's prefix (min over stages); ask every stage to lease it and escrow
        room for the rest. A request sharing blocks beyond its agreed prefix with an earlier
        request of this round waits for the next round, where it reuses them as pending blocks
        (and pending snapshots) instead of computing them twice; on a hybrid model only if
        they reach a snapshot boundary (`waits_for_round`).

        Mutates the leased requests (LEASED, their progress set to the agreed prefix) and the
        round (its leased and tainted requests; the deferred ones leave it, WAITING). `is_dead(
        req, k)`: whether blocks of req's first k a withdrawn request was to compute may be
        released before this lease. Returns the LeaseMsg step and the deferred requests, in
        order, for the leader to queue in front."""
        rnd = self.round
        assert rnd is not None, "no admission round is open"
        hints = _hints_by_request(replies)
        bs = self.block_size
        new_in_round: set[int] = set()
        ends_in_round: set[int] = set()  # hybrid: blocks ending at a last reusable boundary
        items, deferred = [], []
        for req in rnd.requests:
            if req.request_id in rnd.aborted:
                continue
            k, interval = self._agreed_blocks(req, hints[req.request_id])
            if waits_for_round(req, k, new_in_round, ends_in_round, bs, interval):
                deferred.append(req)
                continue
            new_in_round.update(req.block_hashes[k : req.num_tokens // bs])
            last_reusable = (req.num_tokens - 1) // bs
            if self.hybrid and last_reusable > k:
                ends_in_round.add(req.block_hashes[last_reusable - 1])
            req.num_cached_tokens = req.num_scheduled_tokens = req.num_computed_tokens = k * bs
            req.state = RequestState.LEASED
            rnd.leased.append(req)
            if is_dead(req, k):  # released, maybe before this lease
                rnd.tainted.add(req.request_id)
            items.append(LeaseItem(req.request_id, k, req.num_blocks(bs) - k))
        for req in deferred:
            req.state = RequestState.WAITING
        rnd.requests = [r for r in rnd.requests if r not in deferred]
        rnd.phase = "lease"
        return RoundStep(send=LeaseMsg(rnd.round_id, tuple(items))), deferred

    def commits(self, replies) -> dict[int, str]:
        """The lease replies: every stage's capacity noted; returns request id -> the first
        stage's reason, for every request some stage did not lease, escrow and commit."""
        for reply in replies:
            if reply.capacity is not None:
                self.stage_capacity[reply.stage_id] = reply.capacity
        return failures_by_request(replies, self.num_stages)

    def close(self, now: float, admitted: list[Request], release: list[int]) -> RoundStep:
        """The open round is over (the leader decided each leased request): no round is open
        from here, and the latency joins the moving average. Returns the step with the
        ReleaseMsg of `release` (if any) and the RoundOutcome."""
        rnd, self.round = self.round, None
        assert rnd is not None, "no admission round is open"
        retried = tuple(r for r in rnd.leased if r.state == RequestState.WAITING)
        failed = tuple(r for r in rnd.leased if r.state == RequestState.FAILED)
        latency = now - rnd.start_time
        # the planner's prediction of a running round's end: a moving average of the last rounds
        self._latency_s = latency if self._latency_s is None else 0.5 * (self._latency_s + latency)
        outcome = RoundOutcome(rnd.round_id, tuple(admitted), failed, retried, latency)
        release_msg = ReleaseMsg(tuple(release)) if release else None
        return RoundStep(release=release_msg, outcome=outcome)

    def taint(self, dead: set[int]) -> None:
        """Blocks `dead` (hashes) will not be computed: the open round's leased requests whose
        agreed prefix holds one are not admitted (the stages may drop them first)."""
        if self.round is None or not dead:
            return
        bs = self.block_size
        for r in self.round.leased:
            if not dead.isdisjoint(r.block_hashes[: r.num_cached_tokens // bs]):
                self.round.tainted.add(r.request_id)

    def seconds_left(self, now: float) -> float:
        """The open round's predicted time to its end, from the last rounds' latency (no round
        open, or none finished yet: never soon)."""
        if self.round is None or self._latency_s is None:
            return math.inf
        return max(0.0, self._latency_s - (now - self.round.start_time))

    # ---- helpers -----------------------------------------------------------------------------

    def _agreed_blocks(self, req: Request, req_hints: list) -> tuple[int, int]:
        """(blocks every stage holds of req, the snapshot interval in blocks: 0 unless hybrid)."""
        if len(req_hints) != self.num_stages:
            round_id = self.round.round_id if self.round is not None else None
            raise ValueError(
                f"round {round_id}: request {req.request_id} has "
                f"{len(req_hints)} hints for {self.num_stages} stages"
            )
        k = agree_prefix(req, req_hints, self.block_size, hybrid=self.hybrid)
        interval = max(h.snapshot_interval_blocks for h in req_hints) if self.hybrid else 0
        return k, interval


def _hints_by_request(replies) -> dict[int, list]:
    hints: dict[int, list] = collections.defaultdict(list)
    for reply in replies:
        for hint in reply.hints:
            hints[hint.request_id].append(hint)
    return hints
