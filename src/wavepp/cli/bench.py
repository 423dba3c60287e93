"""`wavepp bench`: workloads x policies x concurrencies, measured side by side, interleaved.
With `--url`, the same workloads and report over HTTP against a running `wavepp serve`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from wavepp.cli.args import add_kv_tier_args, add_stage_args, comma_list, engine_default
from wavepp.cli.bench_http import check_http_args, run_over_http
from wavepp.cli.bench_local import LocalRuns
from wavepp.sched.policy import bench_policies, check_policies
from wavepp.workloads.registry import WORKLOAD_NAMES

DEFAULT_POLICIES = "wavepp,wavepp-mpu,static,trtllm-pp,sglang-pp,lockstep,single-stage"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark policies side by side on workloads",
        description="Closed-loop benchmark: every (workload, concurrency) runs each "
        "policy in turn, from empty caches, repeated and interleaved; "
        "prints medians and ratios to lockstep. With --url: the same "
        "workloads over HTTP against a running `wavepp serve` (its model, "
        "pp and policy); vLLM's `vllm bench serve` measures the same server "
        "from outside (benchmarks/vllm_bench_serve.py).",
    )
    _add_target_args(p)
    _add_workload_args(p)
    _add_output_args(p)
    p.set_defaults(func=run)


def requests_for(args, concurrency: int) -> int:
    """Requests in one closed-loop run. With as many requests as the concurrency, every request
    arrives at t = 0 and none arrives while others run: that measures one burst, not the
    steady state in which finishing requests bring new ones to admit."""
    return args.num_requests or max(64, 4 * concurrency)


def build_workloads(args, vocab_size: int, num_requests: int, block_size: int | None = None):
    """The named workloads of `num_requests` prompts each, with token ids from the model's
    vocabulary (ideal hit rates at `block_size`, default the engine's 16)."""
    from wavepp.workloads import WorkloadOptions, workload_from_options

    common = (
        {"vocab_size": vocab_size}
        if block_size is None
        else {"vocab_size": vocab_size, "block_size": block_size}
    )
    opts = WorkloadOptions(
        num_requests=num_requests,
        prompt_len=args.prompt_len,
        prefix_len=args.prefix_len,
        suffix_len=args.suffix_len,
        num_groups=args.num_groups,
        tokens_per_block=args.tokens_per_block,
        max_trace_requests=num_requests,
        trace_file=args.trace_file,
        common=common,
    )
    return [workload_from_options(name, opts) for name in comma_list(args.workload)]


def run(args) -> int:
    """Plan the runs, measure them (in this process, or over HTTP with --url), report."""
    from rich.console import Console

    from wavepp.bench.measure import median_rows
    from wavepp.bench.report import print_table

    console = Console(width=max(Console().width, 160))
    plan = _plan(args, console)
    t_start = time.perf_counter()
    rows, caches_reset, kernels, trace_events = _measure(args, plan, console)
    med = median_rows(rows)
    title = f"medians of {args.repeat} interleaved run(s); fastest first, in bold"
    http_meta = {}
    if args.url:
        http_meta, title = _http_meta(args, plan, med, caches_reset)
    print_table(med, console, title)
    console.print(f"total {time.perf_counter() - t_start:.0f} s")
    run_meta = {**http_meta, **({"kernels": kernels} if kernels else {})}
    _write_outputs(args, plan, console, rows, med, run_meta, trace_events)
    return 0


@dataclass
class BenchPlan:
    """What one bench measures: the model, the policies, and the workloads at each
    concurrency (the same shapes, sized for it), each at each snapshot interval."""

    model: str
    policies: list[str]
    concurrencies: list[int]
    sized: dict[int, list]  # num_requests -> the workloads of that many prompts
    workloads: dict[int, list]  # concurrency -> its workloads (one of sized's lists)
    intervals: list  # snapshot intervals in blocks; [None]: the grid chosen from memory
    ideal_on_grid: dict  # (workload, num_requests, interval) -> ideal hit rate on that grid
    info: object = None  # with --url: the server's answer to server_info


def _plan(args, console) -> BenchPlan:
    """Resolve the model and the policies (the server's with --url), build the workloads and
    print what will run."""
    from wavepp.bench.report import machine

    concurrencies = [int(c) for c in comma_list(args.concurrency)]
    model, policies, vocab_size, block_size, info = _resolve_target(args)
    sized: dict[int, list] = {}
    workloads = {}
    for c in concurrencies:
        n = requests_for(args, c)
        if n not in sized:
            sized[n] = build_workloads(args, vocab_size, n, block_size)
        workloads[c] = sized[n]
    where = f"over HTTP at {args.url} (policy {policies[0]}), client" if args.url else ""
    console.print(
        f"[bold]wavepp bench[/] model={model} pp={args.pp} dtype={args.dtype} {where} on {machine()}"
    )
    intervals = (
        [int(i) for i in comma_list(args.snapshot_interval)] if args.snapshot_interval else [None]
    )
    ideal_on_grid = _describe_workloads(console, sized, intervals)
    return BenchPlan(
        model, policies, concurrencies, sized, workloads, intervals, ideal_on_grid, info
    )


def _resolve_target(args):
    """(model, policies, vocab_size, block_size, server info): from the server with --url,
    else from the arguments and their defaults (which it writes back into args)."""
    if args.url:
        from wavepp.bench.http import server_info

        args.url = args.url.rstrip("/").removesuffix("/v1")  # the server, or OpenAI's base URL
        info = server_info(args.url)
        policies = check_http_args(args, info)
        return info.model, policies, info.vocab_size, info.block_size, info
    from wavepp.model_store import DEFAULT_MODEL, resolve_model
    from wavepp.models import load_model_config

    args.policy, args.pp, args.dtype = (
        args.policy or DEFAULT_POLICIES,
        args.pp or 2,
        args.dtype or "bfloat16",
    )
    policies = check_policies(comma_list(args.policy), bench_policies())
    model = args.model or DEFAULT_MODEL
    return model, policies, load_model_config(resolve_model(model)).vocab_size, None, None


def _describe_workloads(console, sized: dict[int, list], intervals: list) -> dict:
    """Print each workload and its ideal hit rates; return the ideal rate on each snapshot grid,
    by (workload, num_requests, interval)."""
    from wavepp.workloads.workload import ideal_snapshot_hit_rate

    ideal_on_grid = {}
    for wls in sized.values():
        for wl in wls:
            grid = ""
            for interval in intervals if intervals != [None] else []:
                ideal_on_grid[(wl.name, wl.num_requests, interval)] = rate = (
                    ideal_snapshot_hit_rate(wl.prompts, wl.block_size, interval)
                )
                grid += f", on a snapshot grid of {interval} blocks {rate:.1%}"
            console.print(
                f"  workload {wl.name}: {wl.num_requests} prompts, {wl.num_tokens:,} tokens, "
                f"ideal hit rate {wl.ideal_hit_rate:.1%}{grid}"
            )
    return ideal_on_grid


def _measure(args, plan: BenchPlan, console) -> tuple[list, bool | None, dict, list]:
    """Every run under one progress bar: (rows, whether the server's caches were reset (with
    --url; else None), each local engine's kernel paths, the trace events)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = (
        sum(wl.num_requests for c in plan.concurrencies for wl in plan.workloads[c])
        * len(plan.policies)
        * args.repeat
        * len(plan.intervals)
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("warm-up", total=total)
        if args.url:
            rows, caches_reset = run_over_http(
                args, plan.info, plan.concurrencies, plan.workloads, progress, task
            )
            return rows, caches_reset, {}, []
        # snapshot intervals interleave like policies: Engine.reset switches every stage's grid
        runs = LocalRuns(args, plan, progress, task)
        rows = runs.run_all()
    return rows, None, runs.kernels, runs.trace_events


def _http_meta(args, plan: BenchPlan, med: list, caches_reset: bool) -> tuple[dict, str]:
    """What a run over HTTP adds to the report, and the table's title."""
    http_meta = {
        "url": args.url,
        "caches_reset": caches_reset,
        "stage_figures_from": "/metrics" if med and med[0]["stage_utilization"] else None,
    }
    title = (
        f"medians of {args.repeat} run(s) over HTTP at {args.url}, policy {plan.policies[0]} (the server's); "
        f"caches {'emptied before each run (POST /debug/reset)' if caches_reset else 'NOT reset between runs (start the server with --debug)'}; "
        f"TTFT at the client; stage util, idle and admission "
        f"{'from /metrics (admission: histogram buckets, interpolated)' if http_meta['stage_figures_from'] else 'n/a: not in the server /metrics'}"
    )
    return http_meta, title


def _write_outputs(args, plan: BenchPlan, console, rows, med, run_meta: dict, trace_events) -> None:
    """The JSON record (every row, the medians and how they were made), the plot, the trace."""
    from wavepp.bench.report import machine, write_json, write_plot, write_trace

    meta = {
        "model": plan.model,
        "pp": args.pp,
        "dtype": args.dtype,
        "machine": machine(),
        **run_meta,
        "ideal_on_snapshot_grid": [
            {"workload": w, "num_requests": n, "interval_blocks": i, "ideal_hit_rate": r}
            for (w, n, i), r in plan.ideal_on_grid.items()
        ],
        "repeat": args.repeat,
        "command": "wavepp bench " + " ".join(_argv(args)),
    }
    if args.json:
        write_json(args.json, [m.to_dict() for m in rows], {**meta, "medians": med})
        console.print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, med)
        console.print(f"wrote {args.plot}")
    if args.trace:
        write_trace(args.trace, trace_events)
        console.print(f"wrote {args.trace} (open in ui.perfetto.dev)")


def _add_target_args(p) -> None:
    """What is measured: a running server (--url) or the model and its stages here."""
    p.add_argument(
        "--url",
        default=None,
        help="measure a running `wavepp serve` at this URL (e.g. http://127.0.0.1:8000) over HTTP; "
        "the policy, pp and dtype are the server's, and caches are emptied between runs "
        "only if it was started with --debug",
    )
    p.add_argument(
        "--timeout-s", type=float, default=300.0, help="with --url: seconds one request may take"
    )
    p.add_argument(
        "--model",
        default=None,
        help="built-in name or HF-format directory (default: smollm2; "
        "with --url: the served model's name)",
    )
    p.add_argument(
        "--pp", type=int, default=None, help="pipeline stages (default 2; with --url: the server's)"
    )
    add_stage_args(p)


def _add_workload_args(p) -> None:
    """The workloads, the policies, the concurrencies and how many runs."""
    p.add_argument(
        "--workload",
        default="short-suffix,reuse",
        help=f"comma list of: {', '.join(WORKLOAD_NAMES)} (trace: Mooncake)",
    )
    p.add_argument(
        "--policy",
        default=None,
        help=f"comma list of: {', '.join(bench_policies())} (default: {DEFAULT_POLICIES}; "
        f"with --url: the server's, which HTTP cannot switch)",
    )
    p.add_argument("--concurrency", default="8,64", help="comma list, e.g. 1,2,4,8,16,32,64,128")
    p.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="requests per (workload, concurrency) run (default: max(64, 4 x concurrency), "
        "so that high concurrencies reach a steady state of finishing and arriving requests)",
    )
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=512, help="cold, reuse, mixed: prompt length")
    p.add_argument(
        "--prefix-len",
        type=int,
        default=1536,
        help="short-suffix: shared prefix; gsp: system prompt",
    )
    p.add_argument("--suffix-len", type=int, default=64, help="short-suffix: suffix; gsp: question")
    p.add_argument("--num-groups", type=int, default=8)
    p.add_argument("--trace-file", default=None, help="Mooncake JSONL for the trace workload")
    p.add_argument(
        "--tokens-per-block", type=int, default=32, help="trace: tokens per 512-token block"
    )


def _add_output_args(p) -> None:
    """How the stages compute, the snapshot grids, and the files the bench writes."""
    p.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float32"],
        help="default bfloat16; with --url: the server's",
    )
    p.add_argument(
        "--device",
        default=None,
        choices=["cpu", "cuda", "auto"],
        help="where stages compute (default cpu; not with --url: the server's)",
    )
    p.add_argument(
        "--stage-num-blocks",
        default=None,
        metavar="N,N,...",
        help="the pipeline's cache blocks per stage, comma separated (default: sized from the "
        "model and memory; not with --url)",
    )
    p.add_argument(
        "--host-kv-gib",
        type=float,
        default=engine_default("host_kv_gib"),
        help="the pipeline's host KV tier per stage, in GiB (default 0: none; not with --url)",
    )
    add_kv_tier_args(p)
    p.add_argument(
        "--snapshot-interval",
        default=None,
        metavar="BLOCKS",
        help="hybrid models (kimi_linear): comma list of snapshot intervals in blocks, each "
        "run side by side (default: the interval chosen from memory)",
    )
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--plot", default=None, metavar="FILE.png")
    p.add_argument("--trace", default=None, metavar="FILE.json", help="Chrome trace (Perfetto)")


def _argv(args) -> list[str]:
    import sys

    return sys.argv[2:]
