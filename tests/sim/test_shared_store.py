"""The KV store every replica shares, simulated (sim/core/shared_store.py): an LRU of entries by
bytes behind each stage's StoreTier, keyed by the stage's layer range, so the stage of the same
layers on another replica reuses what one computed; its fetches are charged to the stage's next
wave over the store link, its puts are not."""

import argparse
from dataclasses import replace

import pytest

from wavepp.cache import hash_blocks
from wavepp.cache.store_tier import StoreTier
from wavepp.cli import simulate as cli_simulate
from wavepp.sched import PlannerConfig
from wavepp.sched.request import Request
from wavepp.sim import SimCosts, build_sim, run_closed_loop
from wavepp.sim.core.shared_store import SimSharedStore
from wavepp.sim.cost.hardware import get_hardware
from wavepp.sim.cost.model_catalog import get_model
from wavepp.sim.studies.replicas import all_stage_tokens, run_replicas
from wavepp.sim.studies.scenario import SimSetup, build_system, run_setting
from wavepp.workloads.synthetic import short_suffix
from wavepp.workloads.workload import Workload, reusable_tokens

BS = 4
BLOCK_BYTES = 1000
BW = 1e6  # store link, bytes/s one way: a block is 1 ms
LATENCY = 5e-3  # per fetch
T = 1e-2  # every wave's compute


def test_lru_by_bytes_drops_the_least_recently_used_first():
    store = SimSharedStore(capacity_bytes=3500)
    big, small = store.link(BLOCK_BYTES), store.link(500)  # two stages' entry sizes
    big.put(["a1", "a2", "a3"], [0, 1, 2])
    small.put(["b1"], [0])
    assert store.used_bytes == 3500 and list(store._entries) == ["a1", "a2", "a3", "b1"]
    assert big.fetch(["a1"]) is not None  # touched: a2 is now the least recently used
    assert list(store._entries) == ["a2", "a3", "b1", "a1"]
    assert big.fetch(["a2", "gone"]) is None  # one missing: nothing touched, nothing fetched
    big.put(["a3"], [5])  # held: touched, nothing stored
    assert list(store._entries) == ["a2", "b1", "a1", "a3"] and store.num_stored == 4
    big.put(["a4"], [3])  # 1,000 bytes more: a2 goes
    assert list(store._entries) == ["b1", "a1", "a3", "a4"] and store.num_dropped == 1
    small.put(["b2", "b3"], [1, 2])  # b1 goes for b2, a1 for b3
    assert list(store._entries) == ["a3", "a4", "b2", "b3"] and store.num_dropped == 3
    store.link(1500).put(["c1"], [0])  # 500 bytes free: a3 goes
    assert list(store._entries) == ["a4", "b2", "b3", "c1"] and store.num_dropped == 4
    assert store.used_bytes == 3500
    store.link(4000).put(["huge"], [0])  # larger than the store: not kept, nothing dropped
    assert "huge" not in store and store.num_dropped == 4
    assert store.exists(["a1", "a4", "b3"]) == [False, True, True]
    assert (big.num_fetches, big.num_fetched_bytes, big.num_put_bytes) == (2, 1000, 5000)
    assert big.take_counts() == (2, 5000) and big.take_counts() == (0, 0)
    store.check_integrity()


def test_a_tier_of_another_namespace_finds_nothing():
    store = SimSharedStore(100 * BLOCK_BYTES)
    hashes = hash_blocks(list(range(16)), BS)
    first = StoreTier("m/l0-2", BLOCK_BYTES, store.link(BLOCK_BYTES))
    first.publish(hashes, [0, 1, 2, 3])
    same = StoreTier("m/l0-2", BLOCK_BYTES, store.link(BLOCK_BYTES))  # another replica's
    other = StoreTier("m/l0-3", BLOCK_BYTES, store.link(BLOCK_BYTES))
    assert same.match(hashes, 0) == 4 and same.match(hashes, 1) == 3
    assert other.match(hashes, 0) == 0 and other.fetch(hashes) is None
    assert other.num_refused_loads == 1


def _sim(store: SimSharedStore, namespace: str = "m/l0-1"):
    costs = SimCosts(
        wave_seconds=lambda stage, chunks: T,
        store_link_bytes_s=BW,
        store_fetch_latency_s=LATENCY,
    )
    pcfg = PlannerConfig(block_size=BS, num_stages=1, static_wave_tokens=64)
    tier = StoreTier(namespace, BLOCK_BYTES, store.link(BLOCK_BYTES))
    return build_sim(
        "static",
        1,
        costs,
        stage_num_blocks=16,
        block_size=BS,
        planner_config=pcfg,
        check_integrity=True,
        store_tiers=[tier],
    )


def test_a_prefix_another_pipeline_computed_is_fetched_and_only_the_fetch_is_charged():
    prompt = list(range(17))  # 4 full blocks + 1 token
    store = SimSharedStore(100 * BLOCK_BYTES)
    first, second, other = _sim(store), _sim(store), _sim(store, namespace="m/l1-2")
    computed = run_closed_loop(first, [prompt, list(range(100, 103))], 1)
    # the first wave puts its 4 full blocks beside the compute: neither it nor the next wave
    # there waits for them
    assert computed.cached_tokens == 0 and computed.seconds == pytest.approx(2 * T, rel=1e-12)
    assert len(store) == 4 and first.servers[0].tiers.store.num_published_blocks == 4
    fetched = run_closed_loop(second, [prompt], 1)
    # one fetch of 4 blocks, then the last token computed
    assert fetched.cached_tokens == 16 and second.servers[0].tiers.store.num_loaded_blocks == 4
    assert fetched.seconds == pytest.approx(T + LATENCY + 4 * BLOCK_BYTES / BW, rel=1e-12)
    assert len(store) == 4  # its one new block is the partial last one: nothing to put
    missed = run_closed_loop(other, [prompt], 1)  # another layer range: computes it all
    assert missed.cached_tokens == 0 and missed.seconds == pytest.approx(T, rel=1e-12)
    assert len(store) == 8


def _grouped(num_groups: int, gap_s: float) -> Workload:
    """Repeated prefix groups (request i in group i % num_groups), one arrival every gap_s."""
    prompts = short_suffix(24, num_groups, prefix_len=256, suffix_len=16, block_size=16).prompts
    times = tuple(i * gap_s for i in range(len(prompts)))
    return Workload("groups", prompts, 16, arrival_times_s=times)


def test_two_replicas_sharing_a_store_reuse_as_one_replica_does():
    setup = SimSetup(get_model("glm-5"), get_hardware("B300"), 4, token_scale=16)
    stored = replace(setup, kv_tier_gib=64)  # holds the whole workload (asserted below)
    workload = _grouped(num_groups=3, gap_s=1.0)  # odd: each group visits both replicas
    one = run_replicas("wavepp", setup, workload, replicas=1, routing="round-robin")
    alone = run_replicas("wavepp", setup, workload, replicas=2, routing="round-robin")
    shared = run_replicas("wavepp", stored, workload, replicas=2, routing="round-robin")
    # what the derivation below assumes: no request in flight when the next arrives, every
    # pool and the store keep everything they are given
    for row in (one, alone, shared):
        assert row["num_failed"] == 0 and row["ttft_p99_s"] < 1.0
    assert alone["requests_per_replica"] == [12, 12] and shared["store_dropped_blocks"] == 0
    # one replica reuses every block any earlier prompt computed: the workload's ideal; two
    # replicas alone only what their own earlier prompts did; with the store, every replica
    # finds what either computed: the ideal again
    separate = sum(sum(reusable_tokens(workload.prompts[r::2], 16)) for r in (0, 1))
    assert one["hit_rate"] == pytest.approx(workload.ideal_hit_rate, abs=1e-12)
    assert alone["hit_rate"] == pytest.approx(separate / workload.num_tokens, abs=1e-12)
    assert shared["hit_rate"] > alone["hit_rate"]
    assert shared["hit_rate"] == pytest.approx(one["hit_rate"], abs=1e-12)
    # each replica's first prompt of a group but the first one overall came from the store
    tiers = shared["tier_hit_rates"]
    assert tiers["store"] == pytest.approx(shared["hit_rate"] - alone["hit_rate"], abs=1e-12)
    assert tiers["host"] == 0.0 and shared["store_fetched_bytes"] > 0
    assert alone["tier_hit_rates"]["store"] == 0.0 and "store_put_bytes" not in alone


def test_a_slower_store_link_lowers_throughput():
    # pools of 80 blocks, 6 groups of 33-block prompts: the pools cannot keep the groups'
    # prefixes, the store does, so every request past a group's first fetches its prefix
    setup = SimSetup(get_model("glm-5"), get_hardware("B300"), 4, token_scale=16)
    setup = replace(setup, max_pool_blocks=80)
    workload = short_suffix(36, 6, prefix_len=512, suffix_len=16, block_size=16)
    no_store, _ = run_setting("wavepp", setup, workload, 2)
    rows = [
        run_setting("wavepp", replace(setup, kv_tier_gib=64, store_link_gb_s=gb_s), workload, 2)[0]
        for gb_s in (0.0, 10.0, 1.0)  # 0: the NIC's 100 GB/s
    ]
    assert no_store.hit_rate < 0.1 * workload.ideal_hit_rate
    for row in rows:
        assert row.num_failed == 0 and row.store_loaded_blocks > 0
        assert row.hit_rate == pytest.approx(workload.ideal_hit_rate, abs=1e-12)
    tok_s = [row.input_tok_s for row in rows]
    assert tok_s[0] > tok_s[1] > tok_s[2]


def test_a_pipeline_of_another_layer_split_finds_nothing_in_the_store():
    pp4 = SimSetup(get_model("glm-5"), get_hardware("B300"), 4, token_scale=16, kv_tier_gib=64)
    pp8 = replace(pp4, num_devices=8)
    store = SimSharedStore(64 * 2**30)
    prompt = short_suffix(1, 1, prefix_len=256, suffix_len=16, block_size=16).prompts[0]
    first = build_system("wavepp", pp4, store=store)
    run_closed_loop(first, [prompt], 1)
    same, other = build_system("wavepp", pp4, store=store), build_system("wavepp", pp8, store=store)
    spaces = [{sv.tiers.store.namespace for sv in sim.servers} for sim in (first, same, other)]
    assert spaces[0] == spaces[1] and not spaces[0] & spaces[2]
    assert all_stage_tokens(same, prompt, 16, hybrid=False) == 256  # every full block
    assert all_stage_tokens(other, prompt, 16, hybrid=False) == 0
    assert [sv.query((_probe(prompt),))[0].num_blocks for sv in other.servers] == [0] * 8
    report = run_closed_loop(other, [prompt], 1)
    assert report.cached_tokens == 0
    assert sum(sv.tiers.store.num_loaded_blocks for sv in other.servers) == 0


def test_a_hybrid_model_is_refused_a_store():
    with pytest.raises(ValueError, match="snapshots"):
        SimSetup(get_model("kimi-linear"), get_hardware("B300"), 4, kv_tier_gib=1)


def test_simulate_replicas_takes_the_store_and_prints_the_split(monkeypatch, capsys):
    import wavepp.sim.studies.replicas as replicas_mod

    seen = []

    def fake_run_replicas(system, setup, workload, *, replicas, routing):
        seen.append(setup)
        tiers = {"pool": 0.5, "host": 0.0, "store": 0.25}
        return {
            "replicas": replicas,
            "routing": routing,
            "hit_rate": 0.75,
            "tier_hit_rates": tiers,
            "ideal_hit_rate": 0.8,
            "input_tok_s": 1.0,
            "ttft_p50_s": 0.1,
            "ttft_p99_s": 0.2,
            "requests_per_replica": [4, 4],
            "store_put_bytes": 1,
        }

    monkeypatch.setattr(replicas_mod, "run_replicas", fake_run_replicas)
    parser = argparse.ArgumentParser(prog="wavepp")
    cli_simulate.add_parser(parser.add_subparsers(dest="command", required=True))
    argv = ["simulate", "--replicas", "2", "--routing", "round-robin", "--num-requests", "8"]
    args = parser.parse_args([*argv, "--kv-tier-gib", "32", "--store-link-gb-s", "50"])
    assert args.func(args) == 0
    assert (seen[0].kv_tier_gib, seen[0].store_link_bytes_s) == (32.0, 50e9)
    assert "hit rate 0.750 (pool 0.500 host 0.000 store 0.250)" in capsys.readouterr().out


def _probe(prompt):
    return Request.create(0, prompt, 16).probe_item()
