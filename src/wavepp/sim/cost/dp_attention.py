"""Data-parallel attention with expert parallelism (DP attention + EP; SGLang's
`--enable-dp-attention` with DeepEP, TensorRT-LLM's "DEP"): how a group of devices runs one wave
when each device runs its own requests through attention and the dense layers, and all of them
share the routed experts.

    devices    the wave's chunks go to the devices longest first, each to the device with the
               least work so far (a chunk is never split over devices: that would be context
               parallelism, which these deployments do not run; the scheduler gives a request
               at most one device's budget per wave)
    busiest    every layer waits at the experts' exchange for the device with the most work, so
               the wave pays that device's attention, projections, dense MLPs, shared experts,
               router, small kernels and LM head, as one device holding all of those weights
               runs them (`StageCostModel.device`), and the ranks' synchronization beyond that
               (`DP_SYNC_SHARE`)
    experts    every device's tokens through the routed experts, split over the devices
               (`StageCostModel.routed_seconds` over the whole wave)
    exchange   per MoE layer, DeepEP's normal dispatch and combine, nothing else: the busiest
               device's tokens go out in the experts' input format (`ACTIVATION_BYTES`,
               sim/cost/precision.py) and come back in bf16, once per destination, not once
               per expert: once over the NIC to each other node holding one of a token's k
               experts (DeepEP forwards it inside that node over NVLink), once over NVLink to
               each device holding one. Experts spread evenly: a device (node) is hit with
               probability 1 - (1 - 1/devices)^k (nodes alike), and the busiest expert device
               moves its imbalance over the mean (sim/cost/expert_balance.py). NVLink and the
               NIC run at once. Under two-batch overlap (sim/cost/execution.py) the exchange
               runs beside the compute, which loses the SMs the exchange holds; otherwise it
               follows the compute.

The group's KV pool is its devices' pools together (sim/cost/stage_cost.py `kv_split`), and a
request is not pinned to the device that holds its KV: each wave is placed afresh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from wavepp.sim.cost.execution import overlapped
from wavepp.sim.cost.expert_balance import imbalance
from wavepp.sim.cost.precision import ACTIVATION_BYTES

if TYPE_CHECKING:  # sim/cost/stage_cost.py runs these for its dp stages
    from wavepp.sim.cost.stage_cost import ChunkShape, StageCostModel

# DP-rank synchronization: the share of a DP-attention + EP forward its ranks spend waiting for
# the slowest at the exchanges (uneven attention and dense work, launch jitter: what a model of
# equal ranks does not see). 12.3% in TensorRT-LLM's breakdown of one context-only iteration of
# DeepSeek-R1-0528 NVFP4 on GB200 x 4, DEP4, 8K inputs (NVIDIA/TensorRT-LLM tech blog on DWDP,
# table 3: attention 20.4%, grouped GEMM 25.9%, dense GEMM 13.4%, other kernels 18.3%,
# communication 9.6%, synchronization 12.3%), taken for every DP-EP stage
DP_SYNC_SHARE = 0.123


def place(
    device: StageCostModel, chunks: Sequence[ChunkShape], num_devices: int
) -> list[list[ChunkShape]]:
    """The wave's chunks on `num_devices` devices: longest first, each to the least loaded."""
    loads = [0.0] * num_devices
    bins: list[list[ChunkShape]] = [[] for _ in range(num_devices)]
    timed = sorted(((device.wave_seconds([c]), c) for c in chunks), key=lambda t: -t[0])
    for seconds, chunk in timed:
        i = min(range(num_devices), key=loads.__getitem__)
        bins[i].append(chunk)
        loads[i] += seconds
    return bins


def dp_breakdown(stage: StageCostModel, chunks: Sequence[ChunkShape]) -> dict[str, float]:
    """Seconds by cost term of a wave on a dp stage (module docstring)."""
    device = stage.device
    bins = [b for b in place(device, chunks, stage.degree) if b]
    busiest = max(bins, key=device.wave_seconds)
    out = device.breakdown(busiest)
    moe_layers = stage.num_moe_layers
    out.pop("moe_routed", None)
    if moe_layers:
        total = sum(x for _, x in chunks)
        most = max(sum(x for _, x in b) for b in bins)
        out["moe_routed"] = moe_layers * stage.routed_seconds(total)
        # the busiest expert device receives (and sends back) its imbalance over the mean
        busiest = imbalance(stage.degree, stage.execution.placement)
        exchange = moe_layers * exchange_seconds(stage, most) * busiest
        if stage.execution.overlap == "tbo":
            compute = sum(out.values())
            slowed, exposed = overlapped(compute, exchange, stage.hw.num_sms)
            out["comm_sms"] = slowed - compute
            out["collectives"] = exposed
        else:
            out["collectives"] = exchange
    # the ranks wait for each other at every exchange: a share of the forward of its own
    out["dp_sync"] = sum(out.values()) * DP_SYNC_SHARE / (1.0 - DP_SYNC_SHARE)
    return out


def exchange_seconds(stage: StageCostModel, tokens: float) -> float:
    """One MoE layer's dispatch and combine of a device's `tokens` (module docstring)."""
    m, hw, n, nodes = stage.model, stage.hw, stage.degree, stage.num_nodes
    k = m.num_experts_per_tok
    per_copy = tokens * m.hidden_size * (ACTIVATION_BYTES[m.gemm_dtype] + 2.0)
    devices_hit = (n - 1) * (1.0 - (1.0 - 1.0 / n) ** k)
    seconds = devices_hit * per_copy / hw.link_bytes_s + 2 * hw.link_latency_s
    if nodes > 1:
        nodes_hit = (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** k)
        nic = nodes_hit * per_copy / hw.internode_bytes_s + 2 * hw.internode_latency_s
        seconds = max(seconds, nic)
    return seconds
