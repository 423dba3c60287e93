"""`wavepp simulate`: what wavepp does on hardware this machine does not have.

    wavepp simulate --model glm-5 --hardware B300 --pp 4 --workload short-suffix,cold \\
        --concurrency 8,32,128 --policy wavepp,lockstep --json out.json --plot out.png
    wavepp simulate --grid paper --json paper.json     # the paper's grids (also: kimi, all)

Prompt lengths are real tokens; the simulator runs them at 1/--token-scale granularity and
charges costs on real tokens.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

from wavepp.cli.args import comma_list
from wavepp.cli.simulate_options import add_simulate_options
from wavepp.sched.policy import check_policies, simulator_policies


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate",
        help="simulate wavepp and baselines on modeled GPUs",
        description=__doc__.split("\n\n")[0],
    )
    add_simulate_options(p)
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from wavepp.sim.studies.output import (
        grid_summary,
        markdown_tables,
        print_table,
        write_json,
        write_plot,
        write_trace,
    )

    t0 = time.perf_counter()
    traces = []
    if args.grid:
        if args.trace:
            raise ValueError("--trace records single settings; drop --grid or --trace")
        from wavepp.sim.studies.grid import get_grid, run_grid, with_overrides

        settings = get_grid(args.grid, paper_setup=args.setup)
        names = ("weights", "attention_dtype", "kv_dtype", "budget_tokens", "layer_split")
        for name in names + ("trtllm", "sglang", "vllm"):  # the grid's unless given
            if getattr(args, name):
                settings = with_overrides(settings, **{name: getattr(args, name)})
        if args.policy:
            settings = with_overrides(settings, policies=tuple(_policies(args.policy)))
        if args.token_scale is not None:
            if args.token_scale <= 0:
                raise ValueError(f"--token-scale must be positive, got {args.token_scale}")
            settings = with_overrides(settings, token_scale=args.token_scale)
        rows = run_grid(settings, jobs=args.jobs)
    elif args.replicas > 1:
        rows = _run_replicas(args)
        for row in rows:
            print(_replica_line(row))
        if args.json:
            write_json(args.json, rows, {"argv": sys.argv[1:]})
        return 0
    else:
        rows, traces = _run_settings(args)
    wall = time.perf_counter() - t0
    print_table(rows)
    for line in grid_summary(rows):
        print(line)
    print(
        f"simulated {len(rows)} runs in {wall:.1f} s on {platform.machine()} "
        f"({platform.python_implementation()} {platform.python_version()})"
    )
    meta = {"argv": sys.argv[1:], "wall_s": wall}
    if args.json:
        write_json(args.json, rows, meta)
    if args.plot:
        write_plot(rows, args.plot)
    if args.markdown:
        from pathlib import Path

        Path(args.markdown).write_text(markdown_tables(rows))
    if args.trace:
        write_trace(traces, args.trace)
    return 0


def _run_replicas(args) -> list[dict]:
    """--replicas N: every policy x routing on each (open-loop) workload, one row each."""
    from wavepp.route.replica_table import POLICIES
    from wavepp.sim.studies.replicas import run_replicas

    routings = comma_list(args.routing)
    for routing in routings:
        if routing not in POLICIES:
            raise ValueError(f"--routing takes {', '.join(POLICIES)}; got {routing!r}")
    setup = _setup(args)
    rows = []
    for kind in comma_list(args.workload):
        workload = _workload(kind, args, setup, args.num_requests or 256)
        for policy in _policies(args.policy or "wavepp"):
            for routing in routings:
                row = run_replicas(policy, setup, workload, replicas=args.replicas, routing=routing)
                rows.append(
                    {
                        "model": setup.model.name,
                        "hardware": setup.hardware.name,
                        "pp": setup.num_devices,
                        "workload": workload.name,
                        "policy": policy,
                        **row,
                    }
                )
    return rows


def _replica_line(row: dict) -> str:
    """One --replicas row: the hit rate (split by tier where a tier below the pools served any
    of it), throughput, TTFT and the spread."""
    tiers = row["tier_hit_rates"]
    split = (
        f" (pool {tiers['pool']:.3f} host {tiers['host']:.3f} store {tiers['store']:.3f})"
        if tiers["host"] or tiers["store"] or "store_put_bytes" in row
        else ""
    )
    return (
        f"{row['replicas']} replicas, {row['routing']:<11} hit rate {row['hit_rate']:.3f}{split} "
        f"(ideal {row['ideal_hit_rate']:.3f})  {row['input_tok_s']:,.0f} input tok/s  "
        f"TTFT p50 {row['ttft_p50_s']:.3f} s p99 {row['ttft_p99_s']:.3f} s  "
        f"requests per replica {row['requests_per_replica']}"
    )


def _setup(args):
    from wavepp.sim.cost.hardware import get_hardware
    from wavepp.sim.cost.model_catalog import get_model
    from wavepp.sim.cost.precision import with_precision
    from wavepp.sim.loops.sglang import get_sglang
    from wavepp.sim.loops.trtllm import get_trtllm
    from wavepp.sim.loops.vllm_pp import get_vllm
    from wavepp.sim.studies.scenario import SimSetup

    return SimSetup(
        with_precision(
            get_model(args.model),
            weights=args.weights or "",
            attention=args.attention_dtype or "",
            kv=args.kv_dtype or "",
        ),
        get_hardware(args.hardware),
        args.pp,
        token_scale=16 if args.token_scale is None else args.token_scale,
        block_size=args.block_size,
        max_wave_tokens=args.max_wave_tokens,
        internode=args.internode,
        gpus_per_node=args.gpus_per_node,
        host_kv_gib=args.host_kv_gib,
        host_tier_for_baselines=args.host_tier_baselines,
        kv_tier_gib=args.kv_tier_gib,
        store_link_gb_s=args.store_link_gb_s,
        trtllm=get_trtllm(args.trtllm or "legacy"),
        sglang=get_sglang(args.sglang or "legacy"),
        vllm=get_vllm(args.vllm or "legacy"),
        snapshot_interval_blocks=args.snapshot_interval_blocks,
        budget_tokens=args.budget_tokens,
        layer_split=args.layer_split or "auto",
    )


def _run_settings(args) -> tuple[list[dict], list]:
    from wavepp.sim.cost.stages import compare_splits
    from wavepp.sim.studies.grid import precision_columns
    from wavepp.sim.studies.scenario import balanced_on, run_setting

    setup = _setup(args)
    policies = _policies(args.policy or "wavepp,lockstep")
    concurrencies = [int(c) for c in comma_list(args.concurrency)]
    rows, traces = [], []
    for kind, conc in ((k, c) for k in comma_list(args.workload) for c in concurrencies):
        workload = _workload(kind, args, setup, args.num_requests or max(32, 4 * conc))
        if conc == concurrencies[0] and args.pp <= setup.model.num_layers:
            waves = balanced_on(setup, workload).balance_waves
            for line in compare_splits(setup.model, setup.hardware, args.pp, waves):
                print(f"{kind}: {line}")
        for policy in policies:
            result, sim = run_setting(
                policy, setup, workload, conc, check_integrity=args.check_integrity
            )
            rows.append(
                {
                    "grid": "",
                    "model": result.model,
                    "hardware": result.hardware,
                    "pp": result.num_devices,
                    "workload": workload.name,
                    "concurrency": conc,
                    "policy": policy,
                    **precision_columns(setup),
                    **{
                        k: v
                        for k, v in result.row().items()
                        if k
                        not in (
                            "system",
                            "model",
                            "hardware",
                            "num_devices",
                            "workload",
                            "concurrency",
                        )
                    },
                }
            )
            if args.trace:
                traces.append((f"{policy} {workload.name} c={conc}", sim))
    return rows, traces


def _policies(text: str) -> list[str]:
    return check_policies(comma_list(text), simulator_policies())


def _workload(name: str, args, setup, num_requests: int):
    from wavepp.workloads import WorkloadOptions, workload_from_options

    if name.replace("_", "-") in ("trace", "mooncake") and 512 % setup.token_scale:
        raise ValueError("--token-scale must divide 512 for the Mooncake trace")
    s = setup.sim_tokens
    opts = WorkloadOptions(
        num_requests=num_requests,
        prompt_len=s(args.prompt_len),
        prefix_len=s(args.prefix_len),
        suffix_len=s(args.suffix_len),
        num_groups=args.num_groups,
        reuse_ratio=args.reuse_ratio,
        tokens_per_block=512 // setup.token_scale,
        max_trace_requests=args.num_requests or 256,
        trace_file=args.trace_file,
        time_scale=args.time_scale,
        common={"block_size": setup.block_size, "seed": args.seed},
    )
    return workload_from_options(name, opts)
