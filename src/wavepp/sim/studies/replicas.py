"""N prefill replicas behind one router, simulated: each replica is the same pipeline as one
setting (`build_system`: its leader, its stages' pools), and every request is routed by the same
code as `wavepp route` (wavepp/route/replica_table.py `ReplicaTable`), open loop at the
workload's arrival times.

    row = run_replicas("wavepp", setup, workload, replicas=8, routing="cache")
    row = run_replicas_closed(sims, prompts, concurrency=2, routing="cache", block_size=16)

The second drives pipelines its caller built (a fitted CPU machine's, sim/studies/calibrate.py)
closed loop, as a load generator through the router does.

At each arrival every replica is advanced to that time; the `cache` policy then asks each
replica what `/v1/cache_query` answers on a real one (each stage's `StageServer.query`, the
probe's hint, agreed over the stages by `agree_prefix`, split by tier and weighed as the
router weighs it: `held_value`), `approx` consults the router's own
record, `least-load` the requests in flight (counted when each replica finishes one), and
`cache` also what each replica has in flight (the router's record of its requests not ended).
Replicas share nothing else, but for a KV store (`setup.kv_tier_gib`, sim/core/shared_store.py)
every replica's stages reach: one `SimSharedStore`, where the stage of the same layers on each
replica finds what the others computed. Each runs on its own clock between arrivals; the
store's LRU sees their puts and fetches in the order the arrivals advance them.
"""

from __future__ import annotations

from typing import Callable, Sequence, cast

from wavepp.route.replica_table import ReplicaTable
from wavepp.route.replica_table import held_value as route_held_value
from wavepp.sched.admission import agree_prefix, tier_tokens
from wavepp.sched.request import Request
from wavepp.sched.stats import quantile
from wavepp.sim.core.pipeline import PipelineSim
from wavepp.sim.core.shared_store import SimStoreLink
from wavepp.sim.studies.scenario import balanced_on, build_system, shared_store
from wavepp.sim.studies.sim_setup import SimSetup


def all_stage_tokens(sim: PipelineSim, token_ids, block_size: int, hybrid: bool) -> int:
    """Tokens of the prompt every stage of the replica holds now, as its cache query says."""
    return sum(tier_split(sim, token_ids, block_size, hybrid))


def tier_split(sim: PipelineSim, token_ids, block_size: int, hybrid: bool) -> tuple[int, ...]:
    """Those tokens by tier, (pool, host, store), as the cache query's `tiers` says."""
    req = Request.create(0, token_ids, block_size)
    item = (req.probe_item(),)
    hints = [server.query(item)[0] for server in sim.servers]
    return tier_tokens(
        agree_prefix(req, hints, block_size, hybrid=hybrid) * block_size, hints, block_size
    )


def held_value(sim: PipelineSim, token_ids, block_size: int, hybrid: bool) -> float:
    """What the router's cache policy makes of a replica's answer (route/replica_table.py
    `held_value`: a token in a lower tier counts a little less than one in a pool)."""
    pool, host, store = tier_split(sim, token_ids, block_size, hybrid)
    return route_held_value(
        {
            "cached_tokens": pool + host + store,
            "tiers": {"pool": pool, "host": host, "store": store},
        }
    )


def run_replicas(
    system: str,
    setup: SimSetup,
    workload,
    *,
    replicas: int,
    routing: str,
) -> dict:
    """One row (`_Fleet.summary`) of `replicas` pipelines of `system` on `setup`, open loop at
    the workload's arrival times."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if workload.arrival_times_s is None:
        raise ValueError(
            "--replicas simulates an open loop: use a workload with arrival times (trace)"
        )
    setup = balanced_on(setup, workload)
    store = shared_store(setup) if setup.kv_tier_gib else None
    sims = [build_system(system, setup, store=store) for _ in range(replicas)]
    fleet = _Fleet(sims, routing, setup.block_size, setup.model.hybrid)
    for i, (t, prompt) in enumerate(zip(workload.arrival_times_s, workload.prompts)):
        for sim in sims:
            sim.run(until=t)
        fleet.submit(i, prompt, at=t)
    end = max(sim.run() for sim in sims)
    return fleet.summary(end, workload.ideal_hit_rate, setup.token_scale)


def run_replicas_closed(
    sims: list[PipelineSim],
    prompts: Sequence[Sequence[int]],
    *,
    concurrency: int,
    routing: str,
    block_size: int,
    hybrid: bool = False,
    ideal_hit_rate: float | None = None,
) -> dict:
    """`sims` (pipelines built by the caller, e.g. `CpuHardware.build` sharing one store) behind
    the router's policy, closed loop: `concurrency` requests outstanding, the next one routed
    and sent when one ends, as a load generator through `wavepp route` does
    (serve/loadgen.py). The pipelines share one clock: each step advances every one of them to
    the earliest next event of any, so a request routed at time t sees every replica's state
    at t (the events of t itself on the others aside). The same row as `run_replicas`."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    order = iter(enumerate(prompts))

    def send_next(now: float) -> None:
        nxt = next(order, None)
        if nxt is not None:
            fleet.submit(*nxt, at=now, at_once=True)

    fleet = _Fleet(sims, routing, block_size, hybrid, on_free=send_next)
    for _ in range(concurrency):
        send_next(0.0)
    end = 0.0
    while (t := min(sim.next_event_s for sim in sims)) != float("inf"):
        for sim in sims:
            sim.run(until=t)
        end = t
    return fleet.summary(end, ideal_hit_rate, 1)


class _Fleet:
    """Replicas behind one router: what `ReplicaTable` decides for each request (asking every
    replica's cache view under `cache`), which replica runs it, and the row at the end."""

    def __init__(
        self,
        sims: list[PipelineSim],
        routing: str,
        block_size: int,
        hybrid: bool,
        on_free: Callable[[float], None] | None = None,
    ):
        if not sims:
            raise ValueError("no replicas")
        self.sims = sims
        self.routing = routing
        self.block_size = block_size
        self.hybrid = hybrid
        self.table = ReplicaTable([f"replica-{i}" for i in range(len(sims))], routing)
        self._owner: dict[int, tuple[int, tuple]] = {}  # request -> (replica, ticket)
        self._on_free = on_free  # (time) when a request ended
        for sim in sims:
            sim.on_finish = self._on_finish

    def _on_finish(self, request_id: int, now: float) -> None:
        index, ticket = self._owner.pop(request_id)
        self.table.finished(index, 0, ticket)
        if self._on_free is not None:
            self._on_free(now)

    def submit(
        self, request_id: int, prompt: Sequence[int], at: float, at_once: bool = False
    ) -> None:
        """Route the request and send it, to arrive at `at`. `at_once`: where the chosen
        replica's clock is at `at` already (the replica whose request just ended), it arrives
        within the current event, as the single pipeline's closed loop has it (harness.py);
        elsewhere it arrives as an event at `at`."""
        key = tuple(prompt)
        cached = None
        if self.routing == "cache":
            cached = {
                r: held_value(sim, prompt, self.block_size, self.hybrid) / len(prompt)
                for r, sim in enumerate(self.sims)
            }
        choice = self.table.choose(key, cached=cached)
        self._owner[request_id] = (choice.index, self.table.started(choice.index, key))
        sim = self.sims[choice.index]
        sim.submit(request_id, prompt, at=None if at_once and sim.loop.now == at else at)

    def summary(self, end: float, ideal_hit_rate: float | None, token_scale: float) -> dict:
        """The row: the routing, the tier's hit rate (and its split by where the reused blocks
        came from: `tier_hit_rates`) and input tok/s, TTFT p50/p99, the spread of requests over
        the replicas, the decisions by reason, and the shared store's traffic."""
        sims = self.sims
        records = [r for sim in sims for r in sim.records.values()]
        done = [r for r in records if r.failure is None and r.finish is not None]
        ttft = sorted(r.finish - r.arrival for r in done) or [0.0]
        tokens = sum(r.num_tokens for r in done)
        hit_rate = sum(r.num_cached_tokens for r in done) / tokens if tokens else 0.0
        per_replica = [len(sim.records) for sim in sims]
        return {
            "replicas": len(sims),
            "routing": self.routing,
            "num_requests": len(records),
            "num_failed": len(records) - len(done),
            "hit_rate": hit_rate,
            "tier_hit_rates": _tier_hit_rates(sims, hit_rate),
            "ideal_hit_rate": ideal_hit_rate,
            "input_tok_s": tokens / end * token_scale if end > 0 else 0.0,
            "ttft_p50_s": quantile(ttft, 0.5),
            "ttft_p99_s": quantile(ttft, 0.99),
            "requests_per_replica": per_replica,
            "load_spread": max(per_replica) / max(1, min(per_replica)),
            "decisions": dict(sorted(self.table.decisions.items())),
            **_store_traffic(sims),
        }


def _tier_hit_rates(sims: list[PipelineSim], hit_rate: float) -> dict[str, float]:
    """`hit_rate` split by where the reused blocks came from, over every stage of `sims`: the
    blocks loaded from the host tiers (`HostTier.num_loaded`) and fetched from the shared store
    (`StoreTier.num_loaded_blocks`) among those the stages reused (`num_reused_blocks`), the
    rest leased in the GPU pools. Each stage splits a request's prefix its own way (one holds
    it in its pool, another in its host tier), so the split is the stages' mean."""
    servers = [sv for sim in sims for sv in sim.servers]
    reused = sum(sv.num_reused_blocks for sv in servers)
    host = sum(sv.pool.host_tier.num_loaded for sv in servers if sv.pool.host_tier is not None)
    store = sum(sv.tiers.store.num_loaded_blocks for sv in servers if sv.tiers.store is not None)
    if not reused:
        return {"pool": 0.0, "host": 0.0, "store": 0.0}
    return {
        "pool": hit_rate * (reused - host - store) / reused,
        "host": hit_rate * host / reused,
        "store": hit_rate * store / reused,
    }


def _store_traffic(sims: list[PipelineSim]) -> dict[str, int]:
    """Bytes the stages fetched from the shared store (charged to their waves) and put into it
    (counted, not charged), and the entries its LRU dropped; {} without a store."""
    tiers = [sv.tiers.store for sim in sims for sv in sim.servers if sv.tiers.store is not None]
    if not tiers:
        return {}
    links = [cast(SimStoreLink, t.store) for t in tiers]
    return {
        "store_fetched_bytes": sum(link.num_fetched_bytes for link in links),
        "store_put_bytes": sum(link.num_put_bytes for link in links),
        "store_dropped_blocks": links[0].shared.num_dropped,
    }
