"""`wavepp route`: one OpenAI endpoint in front of a prefill server (wavepp) and a decode server
(vLLM with `wavepp.connectors.vllm`), as disaggregated serving runs them.

    client -> router: POST /v1/completions or /v1/chat/completions (streaming or not)
      1. router -> prefill: the same body, max_tokens 1, no streaming, and
                            kv_transfer_params {"do_remote_decode": true}
         <- its kv_transfer_params: where every stage wrote the prompt's KV
      2. router -> decode:  the client's body, plus those kv_transfer_params
         <- the answer (streamed through as it comes), returned to the client

An error from either side goes back to the client with its status and body. A prefill answer
without kv_transfer_params (a server without --kv-store) still decodes: the decode side then
computes the prompt itself; so does one whose kv_transfer_params carry "error" (a stage could
not write its part), forwarded as they are so that the decode side logs why. `usage` is the decode side's, `prompt_tokens_details.cached_tokens`
included (the tokens it loaded).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from wavepp.serve.sampling import TOKEN_CHOICE_FIELDS


_PASS_HEADERS = ("content-type",)


@dataclass(frozen=True)
class RouteConfig:
    prefill_url: str
    decode_url: str
    timeout_s: float = 600.0


def prefill_body(body: dict) -> dict:
    """What the prefill server gets: the request, one token, no stream, the hand-off asked, and
    none of the sampling fields (the decode side samples; the prefill's token is not used)."""
    dropped = ("stream", "stream_options", "max_completion_tokens", *TOKEN_CHOICE_FIELDS)
    out = {k: v for k, v in body.items() if k not in dropped}
    out.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
    return out


def build_router(config: RouteConfig, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The router's app; `transport` replaces the network (tests)."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s, connect=10.0), transport=transport)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await client.aclose()

    app = FastAPI(title="wavepp route", lifespan=lifespan)

    async def relay(path: str, request: Request):
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError) as err:   # malformed, or nested past the parser's depth
            return _error(400, f"the request body is not valid JSON: {str(err)[:200]}", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, f"the request body must be a JSON object, got {type(body).__name__}",
                          "BadRequestError")
        try:
            prefill = await client.post(f"{config.prefill_url}{path}", json=prefill_body(body))
        except httpx.HTTPError as err:
            return _error(502, f"the prefill server at {config.prefill_url} did not answer: {err}")
        if prefill.status_code != 200:
            return _passthrough(prefill)
        params = prefill.json().get("kv_transfer_params")
        decode_body = {**body, "kv_transfer_params": params} if params else dict(body)
        url = f"{config.decode_url}{path}"
        if not body.get("stream"):
            try:
                decode = await client.post(url, json=decode_body)
            except httpx.HTTPError as err:
                return _error(502, f"the decode server at {config.decode_url} did not answer: {err}")
            return _passthrough(decode)
        try:
            upstream = await client.send(client.build_request("POST", url, json=decode_body), stream=True)
        except httpx.HTTPError as err:
            return _error(502, f"the decode server at {config.decode_url} did not answer: {err}")
        if upstream.status_code != 200:
            await upstream.aread()
            await upstream.aclose()
            return _passthrough(upstream)

        async def chunks():
            try:
                async for chunk in upstream.aiter_bytes():
                    yield chunk
            finally:
                await upstream.aclose()   # a client that leaves closes the decode stream too

        return StreamingResponse(chunks(), status_code=200, media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await relay("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await relay("/v1/chat/completions", request)

    @app.get("/v1/models")
    async def models():
        try:
            return _passthrough(await client.get(f"{config.decode_url}/v1/models"))
        except httpx.HTTPError as err:
            return _error(502, f"the decode server did not answer: {err}")

    @app.get("/health")
    async def health():
        bad = []
        for name, url in (("prefill", config.prefill_url), ("decode", config.decode_url)):
            try:
                if (await client.get(f"{url}/health")).status_code != 200:
                    bad.append(name)
            except httpx.HTTPError:
                bad.append(name)
        return JSONResponse({"status": "ok" if not bad else f"unhealthy: {', '.join(bad)}"},
                            status_code=503 if bad else 200)

    return app


def _passthrough(resp: httpx.Response) -> Response:
    headers = {k: v for k, v in resp.headers.items() if k.lower() in _PASS_HEADERS}
    return Response(resp.content, status_code=resp.status_code, headers=headers)


def _error(status: int, message: str, kind: str = "BadGateway") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status)
