"""Which prefill replica a request goes to: the routing policies of `wavepp route`, free of HTTP
(pure: no clock, no I/O), so that one implementation serves the router (route/router.py) and
the simulator's replicas (sim/studies/replicas.py).

    table = ReplicaTable(urls, policy="approx")
    choice = table.choose(prompt_key)          # Choice(index, reason); NoReplica if none is up
    table.started(choice.index) ... table.finished(choice.index, cached_tokens)
    table.set_healthy(index, ok)               # the router's health checks, failures

Policies:
  cache        by what each replica holds on **all** of its stages right now: the router asks
               every healthy replica (POST /v1/cache_query: the round protocol's probe, answered
               by every stage, agreed as admission agrees it), and by what it has in flight there
               (a prompt queued on a replica holds nothing yet, but will: the router's record
               of the requests it sent and that have not ended, which it drops at their end).
               The replica that will hold the most of the prompt (the larger of the two, as a
               share of the prompt; a token in a lower tier counts a little less:
               `TIER_WEIGHTS`) wins, under the same balance rule as approx. Only
               wavepp's replicas can answer this: a pipeline whose stages evict on their own
               reuses only the prefix every stage holds, which no router of its own record sees.
  round-robin  the healthy replicas in turn.
  least-load   the healthy replica with the fewest requests in flight (ties: in turn).
  approx       what routers without a replica's own cache view do (vLLM's router, SGLang's
               gateway `cache_aware`): the router's own record of which prompt prefixes it sent
               to which replica (`PrefixRecord`, chained hashes of fixed chunks of the prompt,
               bounded per replica, least recently sent first out), and the replica holding the
               longest such prefix wins, unless it has `balance_slack` or more requests in
               flight above the least loaded healthy replica: then least-load decides. So no
               replica idles while another has more than `balance_slack` queued above it, and a
               replica that holds nothing a request shares gets requests by load.

What a prefix is taken of and its chunk hashes (`prompt_key`, `chunk_hashes`) are in
prefix_record.py, with the approx policy's record.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from wavepp.route.prefix_record import DEFAULT_MAX_PREFIXES, PrefixRecord, chunk_hashes

POLICIES = ("cache", "approx", "least-load", "round-robin")
# What a cached token is worth to the cache policy by the tier a replica holds it in: one in
# a pool is reused as it is, one in a host tier or the shared store costs a copy first (a
# fraction of computing it, docs/benchmarks/2026-12-06-runtime-host-tier.md), so of two
# replicas holding as much the one with more in its pools wins, then the one with more in
# host memory.
TIER_WEIGHTS = {"pool": 1.0, "host": 0.9, "store": 0.8}


def held_value(answer: dict) -> float:
    """The tokens a replica's /v1/cache_query answer holds, weighted by tier (TIER_WEIGHTS);
    an answer without tiers counts all its cached tokens as pool ones."""
    tiers = answer.get("tiers")
    if not isinstance(tiers, dict):
        return float(int(answer["cached_tokens"]))
    return sum(TIER_WEIGHTS[t] * int(tiers.get(t, 0)) for t in TIER_WEIGHTS)


DEFAULT_BALANCE_SLACK = 4


class NoReplica(Exception):
    """No healthy replica to route to."""


@dataclass(frozen=True)
class Choice:
    index: int
    reason: str  # "round-robin" | "least-load" | "prefix" | "balance"
    matched_chunks: int = 0


@dataclass
class ReplicaState:
    url: str
    healthy: bool = True
    in_flight: int = 0
    num_requests: int = 0
    cached_tokens: int = 0  # the replica's own count, from its answers' usage
    record: PrefixRecord = field(default_factory=PrefixRecord)
    queued: Counter = field(default_factory=Counter)  # chunk hashes of its requests in flight


class ReplicaTable:
    """One side's replicas (the router's prefill or decode servers, the simulator's replicas)
    and the policy that picks among them. It owns each replica's state (health, requests in
    flight, its prefix record), the turn of round-robin and the count of decisions by reason;
    its owner reports what happens (`started`, `finished`, `set_healthy`)."""

    def __init__(
        self,
        urls: Sequence[str],
        policy: str = "round-robin",
        *,
        balance_slack: int = DEFAULT_BALANCE_SLACK,
        max_prefixes: int = DEFAULT_MAX_PREFIXES,
    ):
        if policy not in POLICIES:
            raise ValueError(f"routing must be one of {', '.join(POLICIES)}, got {policy!r}")
        if not urls:
            raise ValueError("at least one prefill replica is needed")
        if balance_slack < 1:
            raise ValueError(f"the balance slack must be >= 1, got {balance_slack}")
        self.policy = policy
        self.balance_slack = balance_slack
        self.replicas = [ReplicaState(u, record=PrefixRecord(max_prefixes)) for u in urls]
        self._next = 0
        self.decisions: dict[str, int] = {}
        self.num_queries, self.query_seconds = 0, 0.0  # the cache policy's questions

    def note_query(self, seconds: float) -> None:
        self.num_queries += 1
        self.query_seconds += seconds

    def healthy(self, exclude: Sequence[int] = ()) -> list[int]:
        return [i for i, r in enumerate(self.replicas) if r.healthy and i not in exclude]

    def choose(self, key, exclude: Sequence[int] = (), cached: dict | None = None) -> Choice:
        """The replica for a request whose prefix is `key` (not one of `exclude`); `cached`
        (the cache policy): {replica: the share of the prompt it holds on all its stages}."""
        up = self.healthy(exclude)
        if not up:
            raise NoReplica("no prefill replica is healthy")
        if self.policy == "cache":
            choice = self._cache(key, up, cached or {})
        elif self.policy == "round-robin":
            choice = Choice(self._in_turn(up), "round-robin")
        elif self.policy == "least-load":
            choice = Choice(self._least_loaded(up), "least-load")
        else:
            choice = self._approx(key, up)
        self.decisions[choice.reason] = self.decisions.get(choice.reason, 0) + 1
        return choice

    def started(self, index: int, key=None) -> tuple:
        """A request went to replica `index`; what `finished` takes back at its end."""
        replica = self.replicas[index]
        replica.in_flight += 1
        replica.num_requests += 1
        if key is None:
            return ()
        if self.policy == "approx":
            replica.record.add(chunk_hashes(key))
        if self.policy == "cache":
            hashes = tuple(chunk_hashes(key))
            replica.queued.update(hashes)
            return hashes
        return ()

    def finished(self, index: int, cached_tokens: int = 0, ticket: tuple = ()) -> None:
        """The request ended; `ticket`: what `started` returned for it."""
        replica = self.replicas[index]
        replica.in_flight = max(0, replica.in_flight - 1)
        replica.cached_tokens += max(0, int(cached_tokens))
        if ticket:
            replica.queued.subtract(ticket)
            for h in ticket:
                if replica.queued[h] <= 0:
                    del replica.queued[h]

    def set_healthy(self, index: int, ok: bool) -> None:
        replica = self.replicas[index]
        if replica.healthy and not ok:
            replica.record.clear()  # a replica that went down may come back with empty caches
        replica.healthy = ok

    def _in_turn(self, up: list[int]) -> int:
        n = len(self.replicas)
        for step in range(n):
            i = (self._next + step) % n
            if i in up:
                self._next = (i + 1) % n
                return i
        return up[0]

    def _least_loaded(self, up: list[int]) -> int:
        low = min(self.replicas[i].in_flight for i in up)
        return self._in_turn([i for i in up if self.replicas[i].in_flight == low])

    def _cache(self, key, up: list[int], cached: dict) -> Choice:
        """By the larger share of the prompt each replica holds (`cached`, its answer) or will
        hold (the leading chunks of its requests in flight)."""
        hashes = chunk_hashes(key)
        held = {}
        for i in up:
            queued = self.replicas[i].queued
            n = 0
            while n < len(hashes) and queued[hashes[n]] > 0:
                n += 1
            held[i] = max(cached.get(i, 0.0), n / len(hashes) if hashes else 0.0)
        return self._best_held(held, up)

    def _approx(self, key, up: list[int]) -> Choice:
        hashes = chunk_hashes(key)
        return self._best_held({i: self.replicas[i].record.match(hashes) for i in up}, up)

    def _best_held(self, held: dict[int, int], up: list[int]) -> Choice:
        """The replica holding the most (`held`: chunks or tokens), the least loaded of those
        that hold as much, unless it has `balance_slack` more in flight than the least loaded
        replica (then least-load); least-load where none holds anything."""
        best = max(held.values())
        if best == 0:
            return Choice(self._least_loaded(up), "least-load")
        low = min(self.replicas[i].in_flight for i in up)
        holders = [i for i in up if held[i] == best]
        i = min(holders, key=lambda j: self.replicas[j].in_flight)
        if self.replicas[i].in_flight - low >= self.balance_slack:
            return Choice(self._least_loaded(up), "balance", best)
        return Choice(i, "prefix", best)
