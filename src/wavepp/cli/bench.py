"""`wavepp bench`: workloads x policies x concurrencies, measured side by side, interleaved.
With `--url`, the same workloads and report over HTTP against a running `wavepp serve`."""

from __future__ import annotations

import itertools
import time

from wavepp.cli.args import add_stage_args, comma_list, layer_split
from wavepp.cli.bench_http import check_http_args, run_over_http
from wavepp.sched.policy import SINGLE_STAGE, bench_policies, check_policies
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
        "--snapshot-interval",
        default=None,
        metavar="BLOCKS",
        help="hybrid models (kimi_linear): comma list of snapshot intervals in blocks, each "
        "run side by side (default: the interval chosen from memory)",
    )
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--plot", default=None, metavar="FILE.png")
    p.add_argument("--trace", default=None, metavar="FILE.json", help="Chrome trace (Perfetto)")
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
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from wavepp.bench.measure import median_rows
    from wavepp.bench.report import machine, print_table, write_json, write_plot, write_trace
    from wavepp.model_store import DEFAULT_MODEL, resolve_model
    from wavepp.models import load_model_config
    from wavepp.workloads.workload import ideal_snapshot_hit_rate

    console = Console(width=max(Console().width, 160))
    concurrencies = [int(c) for c in comma_list(args.concurrency)]
    if args.url:
        from wavepp.bench.http import server_info

        args.url = args.url.rstrip("/").removesuffix("/v1")  # the server, or OpenAI's base URL
        info = server_info(args.url)
        policies = check_http_args(args, info)
        model, vocab_size, block_size = info.model, info.vocab_size, info.block_size
    else:
        args.policy, args.pp, args.dtype = (
            args.policy or DEFAULT_POLICIES,
            args.pp or 2,
            args.dtype or "bfloat16",
        )
        policies = check_policies(comma_list(args.policy), bench_policies())
        model = args.model or DEFAULT_MODEL
        vocab_size, block_size = load_model_config(resolve_model(model)).vocab_size, None
    # workloads[c]: the workloads at concurrency c (the same shapes, sized for c)
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
    t_start = time.perf_counter()
    pipeline_policies = [p for p in policies if p != SINGLE_STAGE]
    rows, trace_events, kernels = [], [], {}
    total = (
        sum(wl.num_requests for c in concurrencies for wl in workloads[c])
        * len(policies)
        * args.repeat
        * len(intervals)
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("warm-up", total=total)
        if args.url:
            http_rows, caches_reset = run_over_http(
                args, info, concurrencies, workloads, progress, task
            )
            rows += http_rows
        else:
            # snapshot intervals interleave like policies: Engine.reset switches every stage's grid
            rows += _run_policies(
                args,
                model,
                policies,
                pipeline_policies,
                concurrencies,
                workloads,
                intervals,
                ideal_on_grid,
                progress,
                task,
                trace_events,
                kernels,
            )
    med = median_rows(rows)
    title = f"medians of {args.repeat} interleaved run(s); fastest first, in bold"
    http_meta = {}
    if args.url:
        http_meta = {
            "url": args.url,
            "caches_reset": caches_reset,
            "stage_figures_from": "/metrics" if med and med[0]["stage_utilization"] else None,
        }
        title = (
            f"medians of {args.repeat} run(s) over HTTP at {args.url}, policy {policies[0]} (the server's); "
            f"caches {'emptied before each run (POST /debug/reset)' if caches_reset else 'NOT reset between runs (start the server with --debug)'}; "
            f"TTFT at the client; stage util, idle and admission "
            f"{'from /metrics (admission: histogram buckets, interpolated)' if http_meta['stage_figures_from'] else 'n/a: not in the server /metrics'}"
        )
    print_table(med, console, title)
    console.print(f"total {time.perf_counter() - t_start:.0f} s")
    meta = {
        "model": model,
        "pp": args.pp,
        "dtype": args.dtype,
        "machine": machine(),
        **http_meta,
        **({"kernels": kernels} if kernels else {}),
        "ideal_on_snapshot_grid": [
            {"workload": w, "num_requests": n, "interval_blocks": i, "ideal_hit_rate": r}
            for (w, n, i), r in ideal_on_grid.items()
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
    return 0


def _argv(args) -> list[str]:
    import sys

    return sys.argv[2:]


def _run_policies(
    args,
    model,
    policies,
    pipeline_policies,
    concurrencies,
    workloads,
    intervals,
    ideal_on_grid,
    progress,
    task,
    trace_events,
    kernels: dict,
) -> list:
    """Every (workload, concurrency, snapshot interval, policy), interleaved run by run on the
    same engines (intervals [None]: the default grid). Fills `kernels`: engine name ("pp",
    "single") -> each stage's kernel paths."""
    from wavepp.bench.measure import run_closed_loop
    from wavepp.bench.report import chrome_trace
    from wavepp.engine import Engine, EngineConfig

    engines, rows = {}, []
    try:
        if pipeline_policies:
            engines["pp"] = Engine(
                EngineConfig(
                    model,
                    pp=args.pp,
                    policy=pipeline_policies[0],
                    dtype=args.dtype,
                    snapshot_interval_blocks=intervals[0],
                    device=args.device or "cpu",
                    layer_split=layer_split(args.layer_split),
                    pin_cpus=args.pin_cpus,
                )
            )
        if SINGLE_STAGE in policies:
            engines["single"] = Engine(
                EngineConfig(
                    model,
                    pp=1,
                    policy="wavepp",
                    dtype=args.dtype,
                    snapshot_interval_blocks=intervals[0],
                    device=args.device or "cpu",
                )
            )
        first = workloads[concurrencies[0]]
        for name, engine in engines.items():  # warm up: first forwards are slow
            engine.prefill([wl.prompts[0][:256] for wl in first])
            if engine.profile is not None:
                progress.console.print(f"  start-up profile ({name}): {engine.profile.describe()}")
        for name, engine in engines.items():  # after every start-up: rank 0's choice is per process
            kernels[name] = list(engine.stage_kernels)
            split = (
                f" (layers per stage {','.join(map(str, engine.config.layer_split))})"
                if engine.config.layer_split
                else ""
            )
            cpus = engine.stage_cpus
            progress.console.print(
                f"  kernels ({name}){split}: "
                + "; ".join(
                    f"stage {i} {k}" + (f" cpus {','.join(map(str, cpus[i]))}" if cpus else "")
                    for i, k in enumerate(kernels[name])
                )
            )
        for rep in range(args.repeat):
            for index in range(len(first)):
                for c, interval in itertools.product(concurrencies, intervals):
                    wl = workloads[c][index]
                    order = policies if rep % 2 == 0 else list(reversed(policies))
                    for pol in order:
                        engine = engines["single" if pol == SINGLE_STAGE else "pp"]
                        engine.reset(
                            "wavepp" if pol == SINGLE_STAGE else pol,
                            snapshot_interval_blocks=interval,
                        )
                        label = pol if interval is None else f"{pol} snap={interval}"
                        progress.update(
                            task, description=f"{wl.name} c={c} {label} (run {rep + 1})"
                        )
                        m = run_closed_loop(
                            engine,
                            wl,
                            c,
                            policy_label=label,
                            repeat=rep,
                            on_progress=lambda n: progress.advance(task, n),
                        )
                        rows.append(m)
                        grid = (
                            ""
                            if interval is None
                            else f" (ideal on the grid {ideal_on_grid[(wl.name, wl.num_requests, interval)]:.1%})"
                        )
                        progress.console.print(
                            f"  {wl.name} c={c} {label} run {rep + 1}: {m.input_tok_s:,.0f} input tok/s, "
                            f"{m.computed_tok_s:,.0f} computed tok/s, hit {m.hit_rate:.1%}{grid}, "
                            f"util {'/'.join(f'{u:.0%}' for u in m.stage_utilization)}"
                        )
                        if args.trace:
                            trace_events += chrome_trace(
                                engine.stats(),
                                f"{wl.name} c={c} {label} r{rep}",
                                pid=len(trace_events) + 1,
                            )
    finally:
        for engine in engines.values():
            engine.shutdown()
    return rows
