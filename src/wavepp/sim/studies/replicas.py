"""N prefill replicas behind one router, simulated: each replica is the same pipeline as one
setting (`build_system`: its leader, its stages' pools), and every request is routed by the same
code as `wavepp route` (wavepp/route/replica_table.py `ReplicaTable`), open loop at the
workload's arrival times.

    row = run_replicas("wavepp", setup, workload, replicas=8, routing="cache")

At each arrival every replica is advanced to that time; the `cache` policy then asks each
replica what `/v1/cache_query` answers on a real one (each stage's `StageServer.query`, the
probe's hint, agreed over the stages by `agree_prefix`), `approx` consults the router's own
record, `least-load` the requests in flight (counted when each replica finishes one), and
`cache` also what each replica has in flight (the router's record of its requests not ended).
Replicas share nothing else: each runs on its own clock between arrivals.
"""

from __future__ import annotations

from wavepp.route.replica_table import ReplicaTable
from wavepp.sched.admission import agree_prefix
from wavepp.sched.request import Request
from wavepp.sched.stats import quantile
from wavepp.sim.core.pipeline import PipelineSim
from wavepp.sim.studies.scenario import build_system
from wavepp.sim.studies.sim_setup import SimSetup


def all_stage_tokens(sim: PipelineSim, token_ids, block_size: int, hybrid: bool) -> int:
    """Tokens of the prompt every stage of the replica holds now, as its cache query says."""
    req = Request.create(0, token_ids, block_size)
    item = (req.probe_item(),)
    hints = [server.query(item)[0] for server in sim.servers]
    return agree_prefix(req, hints, block_size, hybrid=hybrid) * block_size


def run_replicas(
    system: str,
    setup: SimSetup,
    workload,
    *,
    replicas: int,
    routing: str,
) -> dict:
    """One row: the routing, the tier's hit rate and input tok/s, TTFT p50/p99, the spread of
    requests over the replicas, and the decisions by reason."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if workload.arrival_times_s is None:
        raise ValueError(
            "--replicas simulates an open loop: use a workload with arrival times (trace)"
        )
    sims = [build_system(system, setup) for _ in range(replicas)]
    table = ReplicaTable([f"replica-{i}" for i in range(replicas)], routing)
    owner: dict[int, tuple[int, tuple]] = {}  # request -> (replica, ticket)
    for sim in sims:
        sim.on_finish = lambda request_id, now: table.finished(
            owner[request_id][0], 0, owner[request_id][1]
        )
    bs, hybrid = setup.block_size, setup.model.hybrid
    for i, (t, prompt) in enumerate(zip(workload.arrival_times_s, workload.prompts)):
        for sim in sims:
            sim.run(until=t)
        key = tuple(prompt)
        cached = None
        if routing == "cache":
            cached = {
                r: all_stage_tokens(sims[r], prompt, bs, hybrid) / len(prompt)
                for r in range(replicas)
            }
        choice = table.choose(key, cached=cached)
        owner[i] = (choice.index, table.started(choice.index, key))
        sims[choice.index].submit(i, prompt, at=t)
    end = max(sim.run() for sim in sims)
    records = [r for sim in sims for r in sim.records.values()]
    done = [r for r in records if r.failure is None and r.finish is not None]
    ttft = sorted(r.finish - r.arrival for r in done) or [0.0]
    tokens = sum(r.num_tokens for r in done)
    per_replica = [len(sim.records) for sim in sims]
    return {
        "replicas": replicas,
        "routing": routing,
        "num_requests": len(records),
        "num_failed": len(records) - len(done),
        "hit_rate": sum(r.num_cached_tokens for r in done) / tokens if tokens else 0.0,
        "ideal_hit_rate": workload.ideal_hit_rate,
        "input_tok_s": tokens / end * setup.token_scale if end > 0 else 0.0,
        "ttft_p50_s": quantile(ttft, 0.5),
        "ttft_p99_s": quantile(ttft, 0.99),
        "requests_per_replica": per_replica,
        "load_spread": max(per_replica) / max(1, min(per_replica)),
        "decisions": dict(sorted(table.decisions.items())),
    }
