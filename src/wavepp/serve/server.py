"""`wavepp serve`'s process: start the pipeline, then serve HTTP until SIGTERM / SIGINT.

On a stop signal uvicorn stops accepting connections and lets the requests in flight finish
for up to `drain_s`; requests still running then are cancelled, which aborts them in the
engine. The app's shutdown hook then shuts the engine down (joins every stage process), so
nothing is left behind whichever way the server stops; SIGTERM ends it with status 0.
"""

from __future__ import annotations

import gc
import signal
import sys

import uvicorn

from wavepp.engine import Engine, EngineConfig
from wavepp.serve.app import ServeConfig, build_app


def run_server(
    engine_config: EngineConfig,
    serve_config: ServeConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    drain_s: float = 10.0,
    log_level: str = "warning",
) -> None:
    """Start an Engine(engine_config), serve it on host:port, shut it down on exit."""
    engine = Engine(engine_config)
    # what start-up made (modules, the model's objects, the tokenizer) lives as long as the
    # server: out of the collector's sight, a full collection walks only what requests make
    # (before: 100-200 ms a walk, holding the GIL, so every request waited as long)
    gc.freeze()
    try:
        app = build_app(engine, serve_config, on_shutdown=engine.shutdown)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=drain_s,
            lifespan="on",
        )
        server = uvicorn.Server(config)
        print(
            f"wavepp serve: {serve_config.model_name} pp={engine_config.pp} "
            f"policy={engine.policy} on http://{host}:{port}; {engine.stage_split.describe()}",
            file=sys.stderr,
            flush=True,
        )
        # uvicorn re-raises the stop signal once it has shut down; by then the engine is down
        # too, and a SIGTERM that drained cleanly ends the process with status 0
        previous = signal.signal(signal.SIGTERM, lambda sig, frame: None)
        try:
            server.run()
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        engine.shutdown()
