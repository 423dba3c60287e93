"""`wavepp simulate`'s options, by group: the grids, precision, the frameworks' presets, the
setting (model, hardware, policies), the workload, the token scale, the machine, replicas, and
the output. `add_simulate_options` adds them all; the command itself is cli/simulate.py."""

from __future__ import annotations

import argparse

from wavepp.sched.policy import simulator_policies
from wavepp.workloads.registry import WORKLOAD_NAMES


def add_simulate_options(p: argparse.ArgumentParser) -> None:
    """Every option of `wavepp simulate`, in the order its help lists them."""
    _add_grid_options(p)
    _add_precision_options(p)
    _add_framework_options(p)
    _add_setting_options(p)
    _add_workload_options(p)
    _add_scale_options(p)
    _add_machine_options(p)
    _add_replica_options(p)
    _add_output_options(p)


def _add_grid_options(p: argparse.ArgumentParser) -> None:
    """A reconstructed grid of the paper's, and how it runs."""
    p.add_argument(
        "--grid",
        choices=["paper", "kimi", "kimi-k3", "ablation", "all"],
        help="run a reconstructed paper grid",
    )
    p.add_argument("--jobs", type=int, default=2, help="parallel processes for --grid (default 2)")
    p.add_argument(
        "--setup",
        choices=["paper", "legacy", "nvlink"],
        default="paper",
        help="--grid paper: the paper's setup (NVFP4 weights, trtllm-pp as TensorRT-LLM 1.3.0rc26) "
        "or legacy, the earlier one (FP8 weights, the earlier trtllm-pp); --grid kimi-k3: the "
        "paper's (two nodes of 4, a 128 GiB host KV tier per rank) or nvlink, the earlier one "
        "(one NVLink domain, no host tier)",
    )


def _add_precision_options(p: argparse.ArgumentParser) -> None:
    """Weight, attention and KV-cache formats."""
    p.add_argument(
        "--weights",
        choices=["bf16", "fp8", "nvfp4"],
        default=None,
        help="linear layers' weight format (default: the model's own; --grid: the grid's)",
    )
    p.add_argument(
        "--attention-dtype",
        choices=["bf16", "fp8"],
        default=None,
        help="full attention's math (sim/cost/precision.py; default: the model's own, bf16; "
        "--grid: the grid's)",
    )
    p.add_argument(
        "--kv-dtype",
        choices=["bf16", "fp8"],
        default=None,
        help="the KV cache's element (default: the model's own, bf16; --grid: the grid's)",
    )


def _add_framework_options(p: argparse.ArgumentParser) -> None:
    """The fixed-budget systems' budget and the outside frameworks' mechanisms."""
    p.add_argument(
        "--budget-tokens",
        type=int,
        default=0,
        help="real tokens: the fixed budget of static, trtllm-pp, vllm-pp, tp-ep and dp-ep (per "
        "device) in place of each one's default (0: the defaults)",
    )
    p.add_argument(
        "--trtllm",
        choices=["legacy", "rc26"],
        default=None,
        help="TensorRT-LLM's mechanisms in trtllm-pp (default legacy; --grid: the grid's)",
    )
    p.add_argument(
        "--sglang",
        choices=["legacy", "v0.5.18", "v0.5.18-dynamic"],
        default=None,
        help="SGLang's mechanisms in sglang-pp (sim/loops/sglang.py; default legacy; --grid: the "
        "grid's)",
    )
    p.add_argument(
        "--vllm",
        choices=["legacy", "v0.28.0"],
        default=None,
        help="vLLM's mechanisms in vllm-pp (sim/loops/vllm_pp.py; default legacy; --grid: the "
        "grid's)",
    )


def _add_setting_options(p: argparse.ArgumentParser) -> None:
    """The model, hardware and pipeline; the workloads, policies and concurrencies."""
    p.add_argument(
        "--model", default="glm-5", help="glm-5, minimax-m2, kimi-k2, kimi-linear, deepseek-v3"
    )
    p.add_argument("--hardware", default="B300", help="H100, H200, B200, B300, GB200, GB300")
    p.add_argument(
        "--pp", type=int, default=4, help="pipeline stages (tp-ep, dp-ep: the devices of the group)"
    )
    p.add_argument(
        "--layer-split",
        choices=("auto", "even"),
        default=None,
        help="a pipeline's layers per stage: auto, balanced on the layers' modeled costs (the "
        "default), or even, by count; the split of each is printed beside the other",
    )
    p.add_argument(
        "--workload",
        default="short-suffix",
        help=f"comma list of: {', '.join(WORKLOAD_NAMES)} (trace: Mooncake)",
    )
    p.add_argument(
        "--policy",
        default=None,
        help=f"comma list of: {', '.join(simulator_policies())} (default wavepp,lockstep; "
        f"--grid: the grid's own list, every policy)",
    )
    p.add_argument("--concurrency", default="8,32,128", help="comma list (closed loop)")


def _add_workload_options(p: argparse.ArgumentParser) -> None:
    """The shape of the workloads' prompts and of the trace."""
    p.add_argument(
        "--num-requests",
        type=int,
        default=0,
        help="requests per setting (0: max(32, 4 x concurrency); trace: 256)",
    )
    p.add_argument("--prompt-len", type=int, default=8192, help="real tokens (cold, reuse, mixed)")
    p.add_argument(
        "--prefix-len",
        type=int,
        default=28672,
        help="real tokens (short-suffix: shared prefix; gsp: system prompt)",
    )
    p.add_argument(
        "--suffix-len",
        type=int,
        default=4096,
        help="real tokens (short-suffix: suffix; gsp: question)",
    )
    p.add_argument("--num-groups", type=int, default=8)
    p.add_argument("--reuse-ratio", type=float, default=0.9)
    p.add_argument("--trace-file", default=None, help="Mooncake JSONL (default: the shared copy)")
    p.add_argument("--time-scale", type=float, default=1.0, help="trace: arrival time multiplier")


def _add_scale_options(p: argparse.ArgumentParser) -> None:
    """Simulated granularity: tokens per simulated token, block size, largest wave."""
    p.add_argument(
        "--token-scale",
        type=int,
        default=None,
        help="real tokens per simulated token (default 16; --grid: the grid's own, 16 for paper "
        "and 256 for kimi and ablation: a decision taken at one scale is worth checking at "
        "another)",
    )
    p.add_argument("--block-size", type=int, default=16, help="simulated tokens per cache block")
    p.add_argument(
        "--max-wave-tokens",
        type=int,
        default=0,
        help="largest wave of wavepp and lockstep, real tokens (0: from the profiling pass)",
    )


def _add_machine_options(p: argparse.ArgumentParser) -> None:
    """Nodes, NICs, the host KV tier and hybrid models' snapshots."""
    p.add_argument(
        "--internode", action="store_true", help="one stage per node: transfers over the NIC"
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=0,
        help="GPUs per node (0: one NVLink domain): stage boundaries between nodes and tp-ep's "
        "collectives across them go over the NICs",
    )
    p.add_argument(
        "--host-kv-gib",
        type=float,
        default=0.0,
        help="a host (CPU) KV tier of this many GiB per rank for wavepp's systems (0: none)",
    )
    p.add_argument(
        "--host-tier-baselines",
        action="store_true",
        help="give the host KV tier to the baselines too (sglang-pp, trtllm-pp, tp-ep)",
    )
    p.add_argument(
        "--snapshot-interval-blocks",
        type=int,
        default=0,
        help="hybrid models: real state snapshots every this many blocks (0: a stand-in that "
        "resumes only where a chunk ended)",
    )


def _add_replica_options(p: argparse.ArgumentParser) -> None:
    """Several replicas behind one router."""
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="prefill replicas behind one router (sim/studies/replicas.py; open loop: --workload "
        "trace)",
    )
    p.add_argument(
        "--routing",
        default="cache,approx,least-load,round-robin",
        help="with --replicas: the routing policies to compare, comma-separated "
        "(wavepp/route/replica_table.py)",
    )
    p.add_argument(
        "--kv-tier-gib",
        type=float,
        default=0.0,
        help="a KV store of this many GiB that every replica's stages share (Mooncake Store; "
        "sim/core/shared_store.py), below the host tier, for wavepp's systems (0: none)",
    )
    p.add_argument(
        "--store-link-gb-s",
        type=float,
        default=0.0,
        help="GB/s, one direction, of a stage's link to the shared store (0: the GPU's NIC)",
    )


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """The seed, integrity checks and what is written."""
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--check-integrity", action="store_true", help="check every cache after every event"
    )
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a throughput plot (PNG)")
    p.add_argument("--markdown", metavar="PATH", help="write the tables as Markdown (best in bold)")
    p.add_argument(
        "--trace", metavar="PATH", help="write a Chrome trace of the runs (not with --grid)"
    )
