"""`wavepp route`: one OpenAI endpoint in front of a prefill and a decode server (serve/router.py)."""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "route",
        help="one OpenAI endpoint over a prefill (wavepp) and a decode (vLLM) server",
        description="Serve POST /v1/completions and /v1/chat/completions by sending each request "
        "to the prefill server with max_tokens 1 and the KV hand-off asked, then to "
        "the decode server with the returned kv_transfer_params (streams passed "
        "through, errors with their status).",
    )
    p.add_argument(
        "--prefill", required=True, metavar="URL", help="the wavepp serve --kv-store server"
    )
    p.add_argument(
        "--decode", required=True, metavar="URL", help="the vLLM server with the WavePPConnector"
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

    from wavepp.serve.router import RouteConfig, build_router

    for name in ("prefill", "decode"):
        url = getattr(args, name)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--{name} must be an http(s) URL, got {url!r}")
    app = build_router(
        RouteConfig(
            args.prefill.rstrip("/"), args.decode.rstrip("/"), args.timeout_s, args.max_body_bytes
        )
    )
    print(
        f"wavepp route: prefill {args.prefill}, decode {args.decode} on http://{args.host}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
