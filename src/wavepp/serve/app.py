"""The HTTP API over one Engine: OpenAI-style completions and chat, scoring, tokenization,
health and metrics.

    POST /v1/completions       max_tokens 0 or 1: the prompt's KV cache and its first token
    POST /v1/chat/completions  the same for chat messages, through the model's chat template
    POST /v1/score             one query, many items: each item's probabilities over label tokens
    POST /tokenize, /detokenize  as vLLM has them
    POST /v1/cache_query       how much of a prompt every stage holds now, and the load (routers)
    DELETE /v1/kv_transfers/{id}  give up a KV hand-off (the decode side failed: the router says so)
    GET  /v1/models, /health, /metrics
    GET  /debug/integrity, POST /debug/reset (with debug=True: both wait for the pipeline to be idle)

Completions and chat answer in JSON, or in server-sent events with "stream": true
(streaming.py). The routes are here; the work is in api.py, and every call into the engine
runs off the event loop (runner.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from wavepp.engine import Engine, EngineError
from wavepp.openai_http import DEFAULT_MAX_BODY_BYTES, APIError, answer_api_errors
from wavepp.serve.api import API
from wavepp.serve.limits import DEFAULT_MAX_PROMPTS_PER_REQUEST, DEFAULT_MAX_STREAMS


@dataclass(frozen=True)
class ServeConfig:
    """The server's options; the limits are those of limits.py's table (docs/serving.md)."""

    model_name: str
    max_waiting: int = 256  # prompts queued (not yet admitted) beyond which new ones get 429
    retry_after_s: int = 1
    debug: bool = False  # /debug/integrity and /debug/reset (wait for the pipeline to be idle)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompts_per_request: int = DEFAULT_MAX_PROMPTS_PER_REQUEST
    max_streams: int = DEFAULT_MAX_STREAMS

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ValueError(f"ServeConfig.max_waiting must be >= 0, got {self.max_waiting}")
        for name in ("retry_after_s", "max_body_bytes", "max_prompts_per_request", "max_streams"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServeConfig.{name} must be >= 1, got {getattr(self, name)}")


def build_app(engine: Engine, config: ServeConfig, on_shutdown=None) -> FastAPI:
    """The FastAPI app. `on_shutdown` runs (in a thread) when the server stops, after the
    connections drained: it is where the engine shuts down."""
    api = API(engine, config)

    @asynccontextmanager
    async def lifespan(app):
        await asyncio.to_thread(api.runner.start_threads)  # no request starts a thread
        yield
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)
        api.runner.close()

    app = FastAPI(title="wavepp", lifespan=lifespan)
    app.state.api = api
    answer_api_errors(app)
    _add_request_routes(app, api)
    _add_engine_routes(app, api, engine, config)
    if config.debug:
        _add_debug_routes(app, api, engine)
    return app


def _add_request_routes(app: FastAPI, api: API) -> None:
    """The routes that take a request body: their work is in api.py."""
    for path, handle in (
        ("/v1/completions", api.completions),
        ("/v1/chat/completions", api.chat),
        ("/v1/score", api.score),
        ("/tokenize", api.tokenize),
        ("/v1/cache_query", api.cache_query),
        ("/detokenize", api.detokenize),
    ):
        app.add_api_route(path, _taking_request(handle), methods=["POST"])


def _add_engine_routes(app: FastAPI, api: API, engine: Engine, config: ServeConfig) -> None:
    """The routes that ask the engine itself: a transfer dropped, the model, health, metrics."""

    @app.delete("/v1/kv_transfers/{transfer_id}")
    async def drop_transfer(transfer_id: str):
        """A transfer this server wrote, given up: removed from the store (off the request's
        path). 404 for one it does not hold (taken, expired, another server's, never made)."""
        if not await api.runner.work(engine.drop_transfer, transfer_id):
            raise APIError(
                404,
                f"no KV transfer {transfer_id[:140]!r} of this server's is held",
                "transfer_id",
                type_="not_found_error",
            )
        return {"id": transfer_id, "object": "kv_transfer", "deleted": True}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": config.model_name,
                    "object": "model",
                    "created": api.created,
                    "owned_by": "wavepp",
                    "max_model_len": engine.max_prompt_tokens,
                    "wavepp": api.engine_info(),
                }
            ],
        }

    @app.get("/health")
    async def health():
        error = (await api.runner.call(engine.load)).error
        if error:
            raise APIError(503, f"the pipeline is down: {error}", type_="service_unavailable")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(await api.runner.call(api.metrics.render), media_type=CONTENT_TYPE_LATEST)


def _add_debug_routes(app: FastAPI, api: API, engine: Engine) -> None:
    """/debug/integrity and /debug/reset, which wait for the pipeline to be idle, and
    /debug/stage_samples, which does not."""

    @app.get("/debug/integrity")
    async def integrity():
        try:
            reports = await asyncio.to_thread(engine.check_integrity)
        except EngineError as exc:
            raise APIError(503, str(exc), type_="service_unavailable") from None
        return {
            "stages": [
                {"num_live_requests": live, **dataclasses.asdict(cap)} for cap, live in reports
            ],
            "leader_state_size": engine.leader_state_size(),
        }

    @app.get("/debug/stage_samples")
    async def stage_samples():
        """The engine's most recent measured waves (bounded: CoreStats.max_records): per stage
        and wave its chunks' (num_cached, num_new) and compute seconds, and its span in unix
        seconds; what the simulator's CPU hardware is fitted to (sim/studies/calibrate.py)."""
        stats = await asyncio.to_thread(engine.stats)
        return {
            "num_stages": len(stats.stages),
            "stage_samples": [list(s) for s in stats.stage_samples],
            "wave_spans": [list(s) for s in stats.wave_spans],
            "round_spans": [list(s) for s in stats.round_spans],
        }

    @app.get("/debug/requests")
    async def requests():
        """The last served requests' times (at most serve/request_log.py RECENT_REQUESTS, since the
        last reset), oldest first: where each one's time to its first token went."""
        return {"requests": api.metrics.recent.records()}

    @app.post("/debug/reset")
    async def reset():
        """Engine.reset: wait for idle, empty every stage's cache, restart the engine's own
        measurements (what a benchmark does between runs). The policy stays."""
        try:
            await asyncio.to_thread(engine.reset)
        except EngineError as exc:
            raise APIError(503, str(exc), type_="service_unavailable") from None
        api.metrics.restart_engine_figures()
        return {"status": "reset", "stage_num_blocks": list(engine.stage_num_blocks)}


def _taking_request(handle):
    """A route of one parameter, the request, that `handle` answers."""

    async def route(request: Request):
        return await handle(request)

    return route
