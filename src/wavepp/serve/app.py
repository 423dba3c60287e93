"""The HTTP API over one Engine: OpenAI-style completions, scoring, health and metrics.

    POST /v1/completions   max_tokens 0 or 1: the prompt's KV cache and its first token
    POST /v1/score         one query, many items: each item's probabilities over label tokens
    GET  /v1/models, /health, /metrics
    GET  /debug/integrity, POST /debug/reset (with debug=True: both wait for the pipeline to be idle)

A request's life here: parse (400 naming the field) -> tokenize and check against the model
(400) -> the pipeline is alive (else 503 naming the dead stage) -> room in the queue (else
429 with Retry-After) -> submit every prompt -> wait for the results or the client's
disconnect, whichever comes first; a disconnect (or a cancelled handler at shutdown) aborts
every prompt of the request still in the engine, so its leases and escrow go back. A client
that leaves before its body arrived has submitted nothing: it is counted as aborted, with no
traceback in the log (a storm of them would otherwise flood it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import ClientDisconnect

from wavepp.engine import Engine, EngineError
from wavepp.serve.metrics import ServeMetrics
from wavepp.serve.protocol import APIError, CompletionRequest, parse_completion, parse_score
from wavepp.serve.scoring import score_prompts, score_response


@dataclass(frozen=True)
class ServeConfig:
    model_name: str
    max_waiting: int = 256        # prompts queued (not yet admitted) beyond which new ones get 429
    retry_after_s: int = 1
    debug: bool = False           # /debug/integrity and /debug/reset (wait for the pipeline to be idle)

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ValueError(f"ServeConfig.max_waiting must be >= 0, got {self.max_waiting}")


def build_app(engine: Engine, config: ServeConfig, on_shutdown=None) -> FastAPI:
    """The FastAPI app. `on_shutdown` runs (in a thread) when the server stops, after the
    connections drained: it is where the engine shuts down."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        yield
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)

    app = FastAPI(title="wavepp", lifespan=lifespan)
    api = _API(engine, config)
    app.state.api = api

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await api.completions(request)

    @app.post("/v1/score")
    async def score(request: Request):
        return await api.score(request)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": config.model_name, "object": "model", "created": api.created, "owned_by": "wavepp",
            "max_model_len": engine.max_prompt_tokens, "wavepp": api.engine_info()}]}

    @app.get("/health")
    async def health():
        error = engine.load().error
        if error:
            raise APIError(503, f"the pipeline is down: {error}", type_="service_unavailable")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(api.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    if config.debug:
        @app.get("/debug/integrity")
        async def integrity():
            try:
                reports = await asyncio.to_thread(engine.check_integrity)
            except EngineError as exc:
                raise APIError(503, str(exc), type_="service_unavailable") from None
            return {"stages": [{"num_live_requests": live, **dataclasses.asdict(cap)} for cap, live in reports],
                    "leader_state_size": engine.leader_state_size()}

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


class _API:
    def __init__(self, engine: Engine, config: ServeConfig):
        self.engine = engine
        self.config = config
        self.created = int(time.time())
        self.metrics = ServeMetrics(engine)
        names = [config.model_name]
        if Path(config.model_name).name and Path(config.model_name).name != config.model_name:
            names.append(Path(config.model_name).name)
        self.model_names = tuple(names)
        self.has_tokenizer = engine.decode([0]) is not None
        self.top_k = engine.config.top_k

    def engine_info(self) -> dict:
        """What a client needs to reproduce a workload here: the pipeline's shape and policy."""
        c = self.engine.config
        return {"pp": c.num_stages, "policy": self.engine.policy, "dtype": c.dtype, "block_size": c.block_size,
                "vocab_size": self.engine.vocab_size, "stage_num_blocks": list(self.engine.stage_num_blocks),
                "debug": self.config.debug}

    # ---- endpoints ---------------------------------------------------------------------------

    async def completions(self, request: Request):
        body = self._counted(_parse_json, await self._body(request))
        req = self._counted(parse_completion, body, self.model_names, self.top_k)
        token_lists = self._tokenize(req.prompts, "prompt")
        # the prompt's own logprobs (vLLM's prompt_logprobs, or OpenAI's echo with logprobs):
        # every position is computed, none served from the cache
        wants_prompt = req.prompt_logprobs is not None or (req.echo and req.logprobs is not None)
        results = await self._run(request, token_lists, logprob_start=0 if wants_prompt else None)
        return self._completion_response(req, token_lists, results)

    async def score(self, request: Request):
        body = self._counted(_parse_json, await self._body(request))
        req = self._counted(parse_score, body, self.model_names, self.engine.vocab_size)
        query = self._tokenize((req.query,), "query")[0]
        items = self._tokenize(req.items, "items")
        prompts = score_prompts(query, items, req.label_token_ids, req.item_first)
        self._check_lengths([p.token_ids for p in prompts], "items")
        results = await self._run(request, [p.token_ids for p in prompts],
                                  logprob_start=[p.logprob_start for p in prompts])
        return score_response(req, prompts, results, self.config.model_name)

    # ---- the steps of a request --------------------------------------------------------------

    async def _body(self, request: Request) -> bytes:
        try:
            return await request.body()
        except ClientDisconnect:
            # nothing was submitted; the answer goes nowhere, but the handler must end quietly
            self.metrics.count("aborted")
            raise APIError(499, "the client closed the connection before its request arrived",
                           type_="client_closed_request") from None

    def _counted(self, parse, *args):
        try:
            return parse(*args)
        except APIError:
            self.metrics.count("bad_request")
            raise

    def _tokenize(self, prompts, field: str) -> list[list[int]]:
        out = []
        for i, p in enumerate(prompts):
            name = field if len(prompts) == 1 else f"{field}[{i}]"
            try:
                out.append(self.engine.tokenize(p))
            except ValueError as exc:
                self.metrics.count("bad_request")
                raise APIError(400, f"{name}: {exc}", name) from None
        self._check_lengths(out, field)
        return out

    def _check_lengths(self, token_lists, field: str) -> None:
        longest = self.engine.max_prompt_tokens
        for i, ids in enumerate(token_lists):
            if len(ids) > longest:
                name = field if len(token_lists) == 1 else f"{field}[{i}]"
                self.metrics.count("bad_request")
                raise APIError(400, f"{name} has {len(ids)} tokens; this server holds at most "
                                    f"{longest} tokens per prompt (the model's positions and the "
                                    f"smallest stage's cache)", name)

    async def _run(self, request: Request, token_lists, logprob_start=None) -> list:
        """Submit every prompt and wait for all of them, or for the client to go away.
        logprob_start: None, one position for every prompt, or a list (one per prompt)."""
        if not isinstance(logprob_start, list):
            logprob_start = [logprob_start] * len(token_lists)
        load = self.engine.load()
        if load.error:
            self.metrics.count("unavailable", len(token_lists))
            raise APIError(503, f"the pipeline is down: {load.error}", type_="service_unavailable")
        if load.num_waiting + len(token_lists) > self.config.max_waiting:
            self.metrics.count("rejected", len(token_lists))
            raise APIError(429, f"too many requests waiting ({load.num_waiting} queued, at most "
                                f"{self.config.max_waiting}); retry later", type_="rate_limit_error",
                           headers={"Retry-After": str(self.config.retry_after_s)})
        futures = []
        try:
            try:
                for ids, start in zip(token_lists, logprob_start):
                    futures.append(self.engine.submit(ids, logprob_start=start))
            except EngineError as exc:
                self.metrics.count("unavailable", len(token_lists) - len(futures))
                raise APIError(503, f"the pipeline is down: {exc}", type_="service_unavailable") from None
            waiting = asyncio.ensure_future(asyncio.gather(*(asyncio.wrap_future(f) for f in futures),
                                                           return_exceptions=True))
            gone = asyncio.ensure_future(_disconnected(request))
            try:
                await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if not waiting.done():     # the client went away: abort what it asked for
                for f in futures:
                    self.engine.abort(f.request_id)
                await asyncio.wait({waiting}, timeout=5)
                for r in (waiting.result() if waiting.done() else ()):
                    if not isinstance(r, BaseException):
                        self.metrics.observe(r)
                return []   # nobody reads it
            results = waiting.result()
        except asyncio.CancelledError:   # the server stops: abort, then let the cancel go on
            for f in futures:
                self.engine.abort(f.request_id)
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self.metrics.count("unavailable", len(errors))
            raise APIError(503, f"the pipeline is down: {errors[0]}", type_="service_unavailable")
        for r in results:
            self.metrics.observe(r)
        failed = [r for r in results if not r.ok]
        if failed:
            raise APIError(500 if failed[0].error != "aborted" else 503,
                           f"the request failed: {failed[0].error}", type_="server_error")
        return results

    # ---- responses ---------------------------------------------------------------------------

    def token_text(self, token_id: int) -> str:
        """A token's text; "token_id:N" when there is no tokenizer or the token alone is not
        valid text (a part of a multi-byte character), so top_logprobs' keys stay distinct."""
        if self.has_tokenizer:
            text = self.engine.decode([token_id])
            if "\ufffd" not in text:
                return text
        return f"token_id:{token_id}"

    def _append_logprob(self, out: dict, token_id: int, logprob, top, k: int, offset: int) -> None:
        """One token of OpenAI's legacy logprobs: its text, logprob, top-k dict and offset."""
        out["tokens"].append(self.token_text(token_id))
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(None if logprob is None else
                                   {self.token_text(t): lp for t, lp in top[:k]})
        out["text_offset"].append(offset)

    def _vllm_logprobs(self, token_id: int, logprob: float, top, k: int) -> dict:
        """One position of vLLM's prompt_logprobs: {token id: {logprob, rank, decoded_token}},
        the prompt's token and the top k (rank: 1 for the best; null outside the top)."""
        out = {}
        for rank, (t, lp) in enumerate(top[:k], start=1):
            out[str(t)] = {"logprob": lp, "rank": rank, "decoded_token": self.token_text(t)}
        if str(token_id) not in out:
            ranks = [rank for rank, (t, _) in enumerate(top, start=1) if t == token_id]
            out[str(token_id)] = {"logprob": logprob, "rank": ranks[0] if ranks else None,
                                  "decoded_token": self.token_text(token_id)}
        return out

    def _completion_response(self, req: CompletionRequest, token_lists, results) -> dict:
        choices = []
        for i, (prompt, ids, r) in enumerate(zip(req.prompts, token_lists, results)):
            prompt_text = prompt if isinstance(prompt, str) else (
                self.engine.decode(ids) if self.has_tokenizer else "")
            text = prompt_text if req.echo else ""
            logprobs = None
            if req.logprobs is not None:
                logprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                if req.echo:      # the prompt's tokens first: the first has no logprob
                    pairs = [(None, ())] + list(r.prompt_logprobs)
                    offset = 0
                    for t, (lp, top) in zip(ids, pairs):
                        self._append_logprob(logprobs, t, lp, top, req.logprobs, offset)
                        offset += len(self.token_text(t))
            if req.max_tokens == 1:
                if logprobs is not None:
                    self._append_logprob(logprobs, r.first_token_id, r.first_token_logprob,
                                         r.top_logprobs, req.logprobs, len(text))
                text += self.engine.decode([r.first_token_id]) if self.has_tokenizer else \
                    self.token_text(r.first_token_id)
            choice = {"index": i, "text": text, "logprobs": logprobs, "finish_reason": "length",
                      "stop_reason": None}
            if req.prompt_logprobs is not None:
                choice["prompt_logprobs"] = [None] + [
                    self._vllm_logprobs(t, lp, top, req.prompt_logprobs)
                    for t, (lp, top) in zip(ids[1:], r.prompt_logprobs)]
            choices.append(choice)
        num_prompt = sum(len(ids) for ids in token_lists)
        num_completion = req.max_tokens * len(results)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": self.config.model_name, "choices": choices,
            "usage": {"prompt_tokens": num_prompt, "completion_tokens": num_completion,
                      "total_tokens": num_prompt + num_completion,
                      "prompt_tokens_details": {"cached_tokens": sum(r.num_cached_tokens for r in results)}}}


def _parse_json(raw: bytes):
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body is already read, so the next
    ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
