"""`wavepp route`: one OpenAI endpoint in front of prefill replicas and decode servers
(wavepp/route/, `RequestRouter`). Torch-free, as the router is: nothing here or in what `run`
imports loads the engine."""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "route",
        help="one OpenAI endpoint over prefill (wavepp) replicas and decode (vLLM) servers",
        description="Serve POST /v1/completions and /v1/chat/completions by sending each request "
        "to a prefill replica (by --routing) with max_tokens 1 and the KV hand-off asked, then "
        "to a decode server with the returned kv_transfer_params (streams passed through, "
        "errors with their status); without --decode, the replica's own answer.",
    )
    p.add_argument(
        "--prefill",
        required=True,
        metavar="URL[,URL...]",
        help="the wavepp serve replicas (with --kv-transport or --kv-store when --decode is given)",
    )
    p.add_argument(
        "--decode",
        default="",
        metavar="URL[,URL...]",
        help="the vLLM servers with the WavePPConnector (none: the replicas' answers)",
    )
    p.add_argument(
        "--routing",
        default="cache",
        choices=("cache", "approx", "least-load", "round-robin"),
        help="how a prefill replica is picked: cache (what each holds on all its stages, asked "
        "before each request), approx (the router's own record), least-load, round-robin "
        "(wavepp/route/replica_table.py; default cache)",
    )
    p.add_argument(
        "--health-interval-s",
        type=float,
        default=2.0,
        help="seconds between the replicas' health checks (default 2)",
    )
    p.add_argument(
        "--health-timeout-s",
        type=float,
        default=2.0,
        help="a health check unanswered this long fails: the server leaves the rotation "
        "(default 2)",
    )
    p.add_argument(
        "--query-timeout-s",
        type=float,
        default=1.0,
        help="with --routing cache: a replica that does not say what it holds within this "
        "counts as holding nothing (default 1)",
    )
    p.add_argument(
        "--drop-timeout-s",
        type=float,
        default=5.0,
        help="the wait for a prefill server to drop a transfer the decode side failed; past "
        "it the transfer's TTL frees it (default 5)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument(
        "--timeout-s",
        type=float,
        default=600.0,
        help="per upstream request; past it the client gets 504 (default 600)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=32 * 2**20,
        help="a larger request body gets 413 before it is read whole (default 32 MiB)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    import uvicorn

    from wavepp.route.config import RouteConfig
    from wavepp.route.router import RequestRouter

    config = RouteConfig(
        args.prefill,
        args.decode,
        args.timeout_s,
        args.max_body_bytes,
        routing=args.routing,
        health_interval_s=args.health_interval_s,
        health_timeout_s=args.health_timeout_s,
        query_timeout_s=args.query_timeout_s,
        drop_timeout_s=args.drop_timeout_s,
    )
    app = RequestRouter(config).app
    print(
        f"wavepp route ({config.routing}): prefill {', '.join(config.prefill)}, decode "
        f"{', '.join(config.decode) or '(none)'} on http://{args.host}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
