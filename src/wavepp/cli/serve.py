"""`wavepp serve`: an OpenAI-compatible prefill server (FastAPI + uvicorn) over the pipeline."""

from __future__ import annotations

import argparse

from wavepp.cli.args import add_engine_args, add_pipeline_args, engine_config, engine_default
from wavepp.engine_config import KV_PROTOCOLS
from wavepp.kv_events.config import KVEventsConfig
from wavepp.kv_transfer.transports import TRANSPORTS


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the pipeline over HTTP (OpenAI-style completions and chat, /metrics)",
        description="Start the pipeline, then serve POST /v1/completions, /v1/chat/completions "
        "(JSON or streamed), /v1/score, /tokenize, /detokenize, GET /v1/models, "
        "/health and /metrics until SIGTERM or SIGINT. Under "
        "torchrun (one rank per stage, any number of nodes) rank 0 serves HTTP "
        "and the other ranks serve their stage.",
    )
    _add_pipeline_args(p)
    _add_http_args(p)
    add_engine_args(p)
    p.add_argument(
        "--top-k", type=int, default=20, help="most top logprobs a request may ask (default 20)"
    )
    _add_kv_args(p)
    p.add_argument(
        "--kv-events-config",
        type=_kv_events_config,
        default=None,
        metavar="JSON",
        help="publish KV cache events of the blocks every stage holds, as vLLM does with the "
        'same option, e.g. \'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", '
        '"topic": "kv@pod-1"}\' (docs/serving.md, "Behind a KV-aware router")',
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="enable GET /debug/integrity and POST /debug/reset (empties every cache: what "
        "`wavepp bench --url` uses between runs)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from wavepp.cli.prefill import serve_stage
    from wavepp.runtime import torchrun_rank
    from wavepp.serve import ServeConfig, run_server

    ranks = torchrun_rank()
    if ranks is not None and ranks[0] != 0:
        return serve_stage(ranks, args.device)

    model = args.model
    options = engine_config(
        args,
        model,
        kv_store=args.kv_store,
        kv_transport=args.kv_transport,
        kv_transport_protocol=args.kv_transport_protocol,
        kv_host=args.kv_host,
        kv_arena_gib=args.kv_arena_gib,
        kv_store_max_gib=args.kv_store_max_gib,
        kv_ttl_s=args.kv_ttl_s,
        kv_export_wait_s=args.kv_export_wait_s,
        kv_transfer_timeout_s=args.kv_transfer_timeout_s,
        kv_events=args.kv_events_config,
    )
    limits = {
        name: getattr(args, name)
        for name in ("max_body_bytes", "max_prompts_per_request", "max_streams")
        if getattr(args, name) is not None
    }  # else ServeConfig's defaults
    config = ServeConfig(
        args.served_model_name or model, max_waiting=args.max_waiting, debug=args.debug, **limits
    )
    run_server(options, config, host=args.host, port=args.port, drain_s=args.drain_s)
    return 0


def _add_pipeline_args(p) -> None:
    """The model, its name in the API, the stages and the policy."""
    add_pipeline_args(p)
    p.add_argument(
        "--served-model-name", default=None, help="the model's name in the API (default: --model)"
    )


def _add_http_args(p) -> None:
    """Where the server listens, its limits on requests (limits.py's table) and its drain."""
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="prompts queued and not yet admitted beyond which requests get 429 (default 256)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="largest request body taken; a larger one gets 413 (default 32 MiB)",
    )
    p.add_argument(
        "--max-prompts-per-request",
        type=int,
        default=None,
        help="most prompts in one request (a score request: items x labels); more get "
        "400 (default 256; never more than --max-waiting)",
    )
    p.add_argument(
        "--max-streams",
        type=int,
        default=None,
        help="most streamed answers open at once; beyond them requests get 429 (default 256)",
    )
    p.add_argument(
        "--drain-s",
        type=float,
        default=10.0,
        help="on SIGTERM, seconds to let requests in flight finish before aborting them",
    )


def _add_kv_args(p) -> None:
    """The KV hand-off to a decode engine: the transport and its bounds."""
    p.add_argument(
        "--kv-store",
        default=None,
        metavar="DIR",
        help="where every stage writes the KV of requests sent with kv_transfer_params "
        '{"do_remote_decode": true}, for a decode engine (docs/disaggregation.md)',
    )
    p.add_argument(
        "--kv-transport",
        choices=tuple(TRANSPORTS),
        default=None,
        help="how the stages hand the KV on: 'directory' (the default with --kv-store) or "
        "'mooncake' (each stage's own Mooncake transfer engine; the decode side pulls from it)",
    )
    p.add_argument(
        "--kv-transport-protocol",
        choices=KV_PROTOCOLS,
        default=engine_default("kv_transport_protocol"),
        help="with --kv-transport mooncake: the transfer engines' protocol (default %(default)s)",
    )
    p.add_argument(
        "--kv-host",
        default=None,
        help="with --kv-transport mooncake: the address the stages' transfer engines listen on, "
        "the one the decode hosts reach (default: this host's default-route address)",
    )
    p.add_argument(
        "--kv-arena-gib",
        type=float,
        default=engine_default("kv_arena_gib"),
        help="with --kv-transport mooncake: each stage's staging arena; the oldest parts go "
        "when it is full (default %(default)s)",
    )
    p.add_argument(
        "--kv-store-max-gib",
        type=float,
        default=None,
        help="with --kv-store: the store's size beyond which the oldest transfers go",
    )
    p.add_argument(
        "--kv-ttl-s",
        type=float,
        default=engine_default("kv_ttl_s"),
        help="seconds a KV transfer not taken lives (default %(default)s)",
    )
    p.add_argument(
        "--kv-transfer-timeout-s",
        type=float,
        default=engine_default("kv_transfer_timeout_s"),
        help="with --kv-transport mooncake: seconds a transfer of the stages' engines may make "
        "no progress before it fails (rank 0's release writes; the decode side has its own, "
        "the connector's transfer_timeout_s) (default %(default)s)",
    )
    p.add_argument(
        "--kv-export-wait-s",
        type=float,
        default=engine_default("kv_export_wait_s"),
        help="with --kv-store: seconds an answer waits for the stages' KV parts after the "
        "prefill; parts not written by then are named failed (default %(default)s)",
    )


def _kv_events_config(text: str) -> KVEventsConfig:
    """The option's JSON, checked (argparse names the option in its error)."""
    try:
        return KVEventsConfig.from_json(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
