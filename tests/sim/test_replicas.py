"""The simulator's replicas (sim/studies/replicas.py): N pipelines behind the router's own routing
code, open loop on the Mooncake trace. Deterministic; routing by what replicas hold keeps more of
the trace's reuse than spreading requests by load or in turn, and no replica is starved."""

from __future__ import annotations

from pathlib import Path

import pytest

from wavepp.sim.cost.hardware import get_hardware
from wavepp.sim.cost.model_catalog import get_model
from wavepp.sim.studies.replicas import run_replicas
from wavepp.sim.studies.scenario import SimSetup
from wavepp.workloads import WorkloadOptions, workload_from_options
from wavepp.workloads.registry import DEFAULT_MOONCAKE_TRACE

pytestmark = pytest.mark.skipif(
    not Path(DEFAULT_MOONCAKE_TRACE).is_file(), reason="Mooncake trace not present"
)


@pytest.fixture(scope="module")
def trace_setup():
    setup = SimSetup(get_model("glm-5"), get_hardware("B300"), 4, token_scale=16)
    options = WorkloadOptions(
        num_requests=400,
        prompt_len=512,
        prefix_len=256,
        suffix_len=64,
        tokens_per_block=512 // setup.token_scale,
        max_trace_requests=400,
        time_scale=0.05,
        common={"block_size": setup.block_size, "seed": 0},
    )
    return setup, workload_from_options("trace", options)


def test_cache_aware_routing_keeps_the_reuse_spreading_loses(trace_setup):
    setup, workload = trace_setup
    rows = {
        r: run_replicas("wavepp", setup, workload, replicas=4, routing=r)
        for r in ("cache", "approx", "least-load", "round-robin")
    }
    for row in rows.values():
        assert row["num_requests"] == 400 and row["num_failed"] == 0
        assert sum(row["requests_per_replica"]) == 400
        assert min(row["requests_per_replica"]) > 400 / 4 / 2  # nobody starved
        assert 0 <= row["hit_rate"] <= row["ideal_hit_rate"] + 1e-9
    assert rows["round-robin"]["requests_per_replica"] == [100] * 4
    for affine in ("cache", "approx"):
        assert rows[affine]["hit_rate"] >= 0.8 * rows[affine]["ideal_hit_rate"], affine
        for spread in ("least-load", "round-robin"):
            assert rows[affine]["hit_rate"] > 2 * rows[spread]["hit_rate"], (affine, spread)
    again = run_replicas("wavepp", setup, workload, replicas=4, routing="cache")
    assert again == rows["cache"]  # deterministic


def test_replicas_need_an_open_loop_workload(trace_setup):
    setup, _ = trace_setup
    closed = workload_from_options(
        "reuse",
        WorkloadOptions(8, prompt_len=512, prefix_len=0, suffix_len=0, common={"block_size": 16}),
    )
    with pytest.raises(ValueError, match="open loop"):
        run_replicas("wavepp", setup, closed, replicas=2, routing="cache")
