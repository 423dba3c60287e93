"""`wavepp bench --url`: the bench's workloads over HTTP against a running `wavepp serve` (its
model, pp and policy), reported as the in-process runs are (cli/bench.py)."""

from __future__ import annotations

from wavepp.cli.args import comma_list


def check_http_args(args, info) -> list[str]:
    """With --url: the server's policy; what HTTP cannot change must agree with the server."""
    if args.policy is not None and comma_list(args.policy) != [info.policy]:
        raise ValueError(
            f"the server at {args.url} runs policy {info.policy!r}; a policy cannot be switched "
            f"over HTTP: restart it with `wavepp serve --policy ...`, or leave out --policy"
        )
    for name, ours, theirs in (("pp", args.pp, info.pp), ("dtype", args.dtype, info.dtype)):
        if ours is not None and ours != theirs:
            raise ValueError(
                f"the server at {args.url} runs --{name} {theirs}, not {ours}; leave out --{name}"
            )
    for name in (
        "snapshot_interval",
        "trace",
        "device",
        "host_kv_gib",
        "stage_num_blocks",
        "kv_tier",
        "kv_tier_master",
    ):
        if getattr(args, name):
            raise ValueError(
                f"--{name.replace('_', '-')} is not available with --url (the bench cannot "
                f"configure or trace the server's engine)"
            )
    if args.model is not None and args.model != info.model:
        raise ValueError(
            f"the server at {args.url} serves {info.model!r}, not {args.model!r}; leave out --model"
        )
    args.pp, args.dtype = info.pp, info.dtype
    return [info.policy]


def run_over_http(args, info, concurrencies, workloads, progress, task) -> tuple[list, bool]:
    """Every (workload, concurrency) over HTTP, repeated; before each run the server's caches are
    emptied if it allows (--debug). Returns the measurements and whether caches were emptied."""
    from wavepp.bench.http import HTTPBenchError, reset_caches, run_http_closed_loop
    from wavepp.bench.measure import by_tier
    from wavepp.serve.loadgen import run_load

    first = workloads[concurrencies[0]]
    # warm up, as in-process: the server's first forwards are slow
    warm = run_load(
        args.url,
        [wl.prompts[0][:256] for wl in first],
        concurrency=len(first),
        model=info.model,
        timeout_s=args.timeout_s,
    )
    if warm.num_ok != len(first):
        raise HTTPBenchError(
            f"warm-up requests to {args.url} failed: "
            f"{(warm.errors or ['429: too many waiting'])[0]}"
        )
    rows, caches_reset = [], True
    for rep in range(args.repeat):
        for index in range(len(first)):
            for c in concurrencies:
                wl = workloads[c][index]
                caches_reset = reset_caches(info) and caches_reset
                progress.update(
                    task, description=f"{wl.name} c={c} {info.policy} over HTTP (run {rep + 1})"
                )
                m = run_http_closed_loop(
                    info,
                    wl,
                    c,
                    repeat=rep,
                    timeout_s=args.timeout_s,
                    on_progress=lambda n: progress.advance(task, n),
                )
                rows.append(m)
                util = "/".join(f"{u:.0%}" for u in m.stage_utilization) or "n/a"
                progress.console.print(
                    f"  {wl.name} c={c} {info.policy} over HTTP run {rep + 1}: {m.input_tok_s:,.0f} input tok/s, "
                    f"{m.computed_tok_s:,.0f} computed tok/s, hit {m.hit_rate:.1%}{by_tier(m)}, "
                    f"TTFT p50 {m.ttft_p50_ms:,.0f} ms, "
                    f"util {util}"
                )
    return rows, caches_reset
