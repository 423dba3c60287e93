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
    from contextlib import asynccontextmanager

    api = API(engine, config)

    @asynccontextmanager
    async def lifespan(app):
        yield
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)
        api.runner.close()

    app = FastAPI(title="wavepp", lifespan=lifespan)
    app.state.api = api

    answer_api_errors(app)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await api.completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await api.chat(request)

    @app.post("/v1/score")
    async def score(request: Request):
        return await api.score(request)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        return await api.tokenize(request)

    @app.post("/v1/cache_query")
    async def cache_query(request: Request):
        return await api.cache_query(request)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return await api.detokenize(request)

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

    if config.debug:

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

    return app
