"""Replicas on one clock, closed loop (sim/studies/replicas.py `run_replicas_closed`): one
replica is exactly the single pipeline's closed loop; never more requests outstanding than the
concurrency; and two fitted CPU pipelines whose pools hold under a quarter of a cycle reach the
ideal hit rate only through the store they share."""

import pytest

from wavepp.sched.cost_model import CostCoefficients
from wavepp.sim import CpuHardware
from wavepp.sim.core.shared_store import SimSharedStore
from wavepp.sim.harness import run_closed_loop
from wavepp.sim.studies.replicas import run_replicas_closed
from wavepp.workloads.synthetic import short_suffix

BS = 16
CPU = CpuHardware(
    (CostCoefficients(c_wave=1e-3, c0=2e-4, g=1e-6, b=2e-4, a=1e-9),) * 2,
    transfer_latency_s=1e-4,
    result_latency_s=1e-4,
    host_link_bytes_s=5e9,
    store_link_bytes_s=1e9,
)
BLOCK_BYTES = (100_000, 100_000)


def cycle(num_requests: int = 36):
    """Nine groups of a 320-token prefix, taken in turn: round-robin sends each to both."""
    return short_suffix(num_requests, 9, prefix_len=320, suffix_len=48, vocab_size=5000, seed=4)


def build(store=None, blocks: int = 64):
    return CPU.build(
        "wavepp",
        stage_num_blocks=blocks,
        block_size=BS,
        check_integrity=True,
        store=store,
        stage_block_bytes=BLOCK_BYTES if store is not None else (),
    )


def test_one_replica_is_the_single_pipelines_closed_loop():
    prompts = cycle(24).prompts
    alone = run_closed_loop(build(blocks=512), prompts, 3)
    fleet = run_replicas_closed(
        [build(blocks=512)], prompts, concurrency=3, routing="round-robin", block_size=BS
    )
    assert fleet["num_failed"] == 0 and fleet["num_requests"] == len(prompts)
    assert fleet["hit_rate"] == pytest.approx(alone.cached_tokens / alone.input_tokens, abs=1e-12)
    assert fleet["input_tok_s"] == pytest.approx(alone.input_tokens / alone.seconds, rel=1e-9)


@pytest.mark.parametrize("routing", ["round-robin", "cache"])
def test_never_more_outstanding_than_the_concurrency(routing):
    sims = [build(), build()]
    row = run_replicas_closed(sims, cycle().prompts, concurrency=3, routing=routing, block_size=BS)
    assert row["num_failed"] == 0 and sum(row["requests_per_replica"]) == 36
    spans = [(r.arrival, r.finish) for sim in sims for r in sim.records.values()]
    starts = sorted(a for a, _ in spans)
    assert starts[:3] == [0.0, 0.0, 0.0]  # the first three leave at once
    for t, _ in spans:  # at every arrival: those begun and not ended, itself included
        assert sum(1 for a, f in spans if a <= t < f) <= 3


def test_the_shared_store_turns_a_cycle_into_hits():
    work = cycle()
    rows = {}
    for tier in ("none", "store"):
        store = SimSharedStore(1 << 30) if tier == "store" else None
        sims = [build(store), build(store)]
        rows[tier] = run_replicas_closed(
            sims,
            work.prompts,
            concurrency=2,
            routing="round-robin",
            block_size=BS,
            ideal_hit_rate=work.ideal_hit_rate,
        )
    none, store = rows["none"], rows["store"]
    # a pool of 64 blocks holds three of the nine 20-block prefixes: each replica sees a group
    # again only after the other eight went by
    assert none["hit_rate"] == 0.0
    assert store["hit_rate"] == pytest.approx(work.ideal_hit_rate, abs=1e-12)
    assert store["tier_hit_rates"]["store"] > 0.5 * store["hit_rate"]
    assert store["store_fetched_bytes"] > 0
    assert store["input_tok_s"] > 1.5 * none["input_tok_s"]


def test_a_host_tier_on_the_fitted_machine_keeps_the_cycle():
    """One fitted CPU pipeline whose pools hold a third of the cycle: its host tier brings every
    prefix back (the ideal), and its copies are charged at the host link's rate."""
    work = cycle()
    rows = {}
    for host in (0, 1 << 30):
        sim = CPU.build(
            "wavepp",
            stage_num_blocks=64,
            block_size=BS,
            check_integrity=True,
            host_kv_bytes=host,
            stage_block_bytes=BLOCK_BYTES if host else (),
        )
        rows[host] = run_closed_loop(sim, work.prompts, 2)
    none, tier = rows[0], rows[1 << 30]
    assert none.cached_tokens == 0
    assert tier.cached_tokens / tier.input_tokens == pytest.approx(work.ideal_hit_rate, abs=1e-12)
    with pytest.raises(ValueError, match="host_link_bytes_s"):
        CpuHardware(CPU.stage_costs).build(
            "wavepp", host_kv_bytes=1 << 30, stage_block_bytes=BLOCK_BYTES
        )
