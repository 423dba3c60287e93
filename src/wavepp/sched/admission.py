"""Agreement on what a request may reuse, from every stage's hint.

A request may reuse only the prefix cached on **all** stages: the minimum of the stages' hints,
capped so that at least one token is computed. For a hybrid model (linear-attention layers with
recurrent state) the boundary must also be a block where every stage holds a recurrent-state
snapshot, written or pending (a request in flight will write it before any chunk after it runs
there): the candidate is lowered to the largest boundary common to all stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from wavepp.sched.messages import Hint, LeaseMsg, ProbeMsg, ReleaseMsg
from wavepp.sched.request import Request


def agree_prefix(
    req: Request, hints: Sequence[Hint], block_size: int, *, hybrid: bool = False
) -> int:
    """Number of leading blocks `req` reuses, given one hint per stage."""
    k = min(h.num_blocks for h in hints)
    k = min(k, req.max_reusable_blocks(block_size))
    if hybrid and k > 0:
        # the largest boundary <= k with a snapshot on every stage (never one some stage lacks)
        common = set(range(1, k + 1))
        for h in hints:
            common.intersection_update(h.snapshot_set())
        k = max(common, default=0)
    return k


def tier_tokens(cached: int, hints: Sequence[Hint], block_size: int) -> tuple[int, int, int]:
    """Of the `cached` tokens every stage holds (agree_prefix's, in tokens), where the stages
    hold them: (pool, host, store). `pool`: what every stage has in its pool; `host`: what
    every stage has in its pool or its host tier beyond that; `store`: the rest, in the shared
    store (the hints' num_host_blocks and num_store_blocks split each stage's run)."""
    in_pool = min(h.num_blocks - h.num_host_blocks - h.num_store_blocks for h in hints)
    above_store = min(h.num_blocks - h.num_store_blocks for h in hints)
    pool = min(cached, in_pool * block_size)
    host = min(cached, above_store * block_size) - pool
    return pool, host, cached - pool - host


def waits_for_round(
    req: Request,
    k: int,
    new_in_round: set[int],
    ends_in_round: set[int],
    block_size: int,
    interval_blocks: int,
) -> bool:
    """Whether `req`, agreed to reuse `k` blocks, would reuse more in the next round: blocks
    [k, ...) are computed by earlier requests of this round (`new_in_round`), and once they
    are pending they can be leased instead of computed twice. A hybrid model
    (`interval_blocks` > 0) resumes only at a snapshot, so the wait pays only if those blocks
    reach one the earlier requests will save: a grid point, or the last reusable boundary of
    one of them (`ends_in_round`: the hashes of the blocks before those)."""
    num_full = min(req.num_tokens // block_size, req.max_reusable_blocks(block_size))
    hashes = req.block_hashes
    if k >= num_full or hashes[k] not in new_in_round:
        return False
    if not interval_blocks:
        return True
    b = k
    while b < num_full and hashes[b] in new_in_round:
        b += 1
        if b % interval_blocks == 0 or hashes[b - 1] in ends_in_round:
            return True
    return False


@dataclass
class AdmissionRound:
    """The leader's state for one round: the requests in it and the answers gathered so far.

    phase: "probe" -> "lease" (lease, escrow and commit in one exchange) -> done
    """

    round_id: int
    requests: list[Request]
    start_time: float
    phase: str = "probe"
    leased: list[Request] = field(default_factory=list)
    aborted: set[int] = field(default_factory=set)
    # requests whose agreed prefix holds a block that a withdrawn request was to compute: the
    # stages may drop it (the release) before this round's lease, so they are not admitted
    tainted: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class RoundOutcome:
    round_id: int
    admitted: tuple[Request, ...]
    failed: tuple[Request, ...]  # failed for good, with a reason
    retried: tuple[Request, ...]  # back to waiting
    latency_s: float


@dataclass(frozen=True)
class RoundStep:
    """What one phase of a round asks of its driver, in this order: send `release` to every
    stage (no reply), then either send `send` to every stage and hand all their replies to
    `Leader.advance_round`, or, with `outcome`, the round is over."""

    send: "ProbeMsg | LeaseMsg | None" = None
    release: ReleaseMsg | None = None
    outcome: RoundOutcome | None = None


def failures_by_request(replies, num_stages: int) -> dict[int, str]:
    """request id -> the first stage's reason, for every request some stage did not accept."""
    if len(replies) != num_stages:
        raise ValueError(f"expected {num_stages} replies, got {len(replies)}")
    failed: dict[int, str] = {}
    for reply in sorted(replies, key=lambda r: r.stage_id):
        for res in reply.results:
            if not res.ok and res.request_id not in failed:
                failed[res.request_id] = res.reason
    return failed
