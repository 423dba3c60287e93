"""`wavepp route`: one OpenAI endpoint in front of prefill replicas (wavepp) and decode servers
(vLLM with `wavepp.connectors.vllm`), as disaggregated serving runs them.

Each request goes to one prefill replica, picked by the routing policy (wavepp/routing.py:
round-robin, least-load, approx), among the replicas that pass their health checks (GET /health
every `health_interval_s`; one that fails leaves the rotation, and comes back when it passes
again). A replica that cannot be reached is marked down and the request goes to another, once.
Without decode servers the router serves the replicas' own answers (the first token), streams
included: a prefill-only tier routed. With several decode servers, the one with the fewest
requests in flight decodes.

    client -> router: POST /v1/completions or /v1/chat/completions (streaming or not)
      1. router -> prefill: the same body, max_tokens 1, no streaming, and
                            kv_transfer_params {"do_remote_decode": true}
         <- its kv_transfer_params: where every stage holds its part of the prompt's KV
      2. router -> decode:  the client's body, with those kv_transfer_params in place of any the
                            client sent (a client never names a transfer to the decode side)
         <- the answer (streamed through as it comes), returned to the client
      3. the decode side failed (no answer, or not a 200): router -> prefill
                            DELETE /v1/kv_transfers/{id}, so the transfer does not wait for its TTL

An error from either side goes back to the client with its status, body and end-to-end headers
(`Retry-After` among them). The router's own errors: 502 for an upstream that cannot be reached
or answers what is not an OpenAI answer, 504 for one that does not answer within
`timeout_s`; their messages name the side, never its address (the log has that). A prefill
answer without kv_transfer_params (a server with no hand-off: no --kv-store, no --kv-transport)
still decodes: the decode side then computes the prompt itself; so does one whose
kv_transfer_params carry "error" (a stage could not hand its part on), forwarded as they are so
that the decode side logs why. `usage` is the decode side's,
`prompt_tokens_details.cached_tokens` included (the tokens it loaded).

No state is kept between requests: the upstream client takes no cookies (a `Set-Cookie` goes
back to the client whose answer carried it, and nowhere else), and each request's end-to-end
headers go to both upstreams (hop-by-hop ones, RFC 9110 7.6.1, are dropped both ways).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import json
import logging
import time
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from wavepp.openai_http import DEFAULT_MAX_BODY_BYTES, TOKEN_CHOICE_FIELDS, APIError, read_body
from wavepp.routing import POLICIES, NoReplica, ReplicaTable, prompt_key
from wavepp.serve.upstream import (
    REQUEST_OWN,
    NoCookies,
    UpstreamError,
    cached_tokens_of,
    end_to_end,
    error_response,
    finite_float,
    not_json,
    pass_answer,
    passthrough,
    route_metrics,
)

log = logging.getLogger(__name__)

DROP_TIMEOUT_S = 5.0
HEALTH_TIMEOUT_S = 2.0
QUERY_TIMEOUT_S = 1.0
# what a cache query carries of a request: its prompt or its messages (as /tokenize takes them)
QUERY_FIELDS = ("prompt", "messages", "add_generation_prompt", "continue_final_message")


@dataclass(frozen=True)
class RouteConfig:
    """`prefill` and `decode`: one URL, a comma-separated list, or a sequence of them (decode
    may be empty: no decode step)."""

    prefill: tuple[str, ...] | str
    decode: tuple[str, ...] | str = ()
    timeout_s: float = 600.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    routing: str = "cache"
    health_interval_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("prefill", "decode"):
            value = getattr(self, name)
            urls = value.split(",") if isinstance(value, str) else list(value or ())
            urls = tuple(u.strip().rstrip("/") for u in urls if u.strip())
            for url in urls:
                if not url.startswith(("http://", "https://")):
                    raise ValueError(f"a {name} server must be an http(s) URL, got {url!r}")
            object.__setattr__(self, name, urls)
        if not self.prefill:
            raise ValueError("at least one prefill server is needed")
        if self.routing not in POLICIES:
            raise ValueError(f"routing must be one of {', '.join(POLICIES)}, got {self.routing!r}")
        if not self.health_interval_s > 0:
            raise ValueError(f"the health interval must be positive, got {self.health_interval_s}")
        if not self.timeout_s > 0:
            raise ValueError(f"the upstream timeout must be positive, got {self.timeout_s} s")
        if self.max_body_bytes < 1:
            raise ValueError(f"the body limit must be >= 1 byte, got {self.max_body_bytes}")


def prefill_body(body: dict) -> dict:
    """What the prefill server gets: the request, one token, no stream, the hand-off asked, and
    none of the sampling fields (the decode side samples; the prefill's token is not used)."""
    dropped = ("stream", "stream_options", "max_completion_tokens", *TOKEN_CHOICE_FIELDS)
    out = {k: v for k, v in body.items() if k not in dropped}
    out.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
    return out


def decode_body(body: dict, params: dict | None) -> dict:
    """What the decode server gets: the client's request with the prefill's kv_transfer_params
    (none where the prefill returned none), never the client's own."""
    out = {k: v for k, v in body.items() if k != "kv_transfer_params"}
    if params:
        out["kv_transfer_params"] = params
    return out


def build_router(config: RouteConfig, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The router's app; `transport` replaces the network (tests)."""
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
        transport=transport,
        cookies=http.cookiejar.CookieJar(policy=NoCookies()),
    )
    prefills = ReplicaTable(config.prefill, config.routing)
    decodes = ReplicaTable(config.decode, "least-load") if config.decode else None

    async def check_health() -> None:
        tables = [t for t in (prefills, decodes) if t is not None]
        for table in tables:
            for i, replica in enumerate(table.replicas):
                try:
                    ok = (
                        await client.get(f"{replica.url}/health", timeout=HEALTH_TIMEOUT_S)
                    ).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok != replica.healthy:
                    log.warning("route: %s is %s", replica.url, "back" if ok else "down")
                table.set_healthy(i, ok)

    async def health_loop() -> None:
        while True:
            await asyncio.sleep(config.health_interval_s)
            try:
                await check_health()
            except Exception:  # the next round tries again
                log.exception("route: health check failed")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(health_loop())
        yield
        task.cancel()
        await client.aclose()

    app = FastAPI(title="wavepp route", lifespan=lifespan)
    app.state.prefills, app.state.decodes = prefills, decodes

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def send(side: str, method: str, url: str, headers, *, stream: bool = False, **kwargs):
        try:
            return await client.send(
                client.build_request(method, url, headers=headers, **kwargs), stream=stream
            )
        except httpx.HTTPError as err:
            log.warning("route: %s %s failed: %r", method, url, err)
            raise UpstreamError(side, err, config.timeout_s) from None

    async def drop_transfer(prefill_url: str, params: dict | None) -> None:
        """The decode side failed: the replica that prefilled drops its transfer (best effort)."""
        transfer_id = (params or {}).get("transfer_id")
        if not isinstance(transfer_id, str):
            return
        try:
            await client.delete(
                f"{prefill_url}/v1/kv_transfers/{transfer_id}", timeout=DROP_TIMEOUT_S
            )
        except httpx.HTTPError as err:
            log.warning(
                "route: the prefill server did not drop KV transfer %s: %r", transfer_id, err
            )

    async def held_tokens(body: dict, headers) -> dict[int, float]:
        """The cache policy's question to every healthy replica: how many of this request's
        tokens it holds on all its stages (POST /v1/cache_query); 0 for one that does not
        answer in QUERY_TIMEOUT_S (it is not marked down for that: its health check decides).
        -> {replica: the share of the prompt it holds}."""
        query = {k: body[k] for k in QUERY_FIELDS if k in body}
        up = prefills.healthy()

        async def ask(i: int) -> float:
            url = f"{prefills.replicas[i].url}/v1/cache_query"
            try:
                r = await client.post(url, json=query, headers=headers, timeout=QUERY_TIMEOUT_S)
                if r.status_code != 200:
                    return 0.0
                answer = r.json()
                return int(answer["cached_tokens"]) / max(1, int(answer["num_tokens"]))
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return 0.0

        t0 = time.perf_counter()
        held = dict(zip(up, await asyncio.gather(*(ask(i) for i in up))))
        prefills.note_query(time.perf_counter() - t0)
        return held

    async def to_replica(body: dict, path: str, headers, key, *, stream: bool, held=None):
        """Send to a prefill replica by the policy; one that cannot be reached is marked down
        and another tried, once. -> (replica index, response); UpstreamError or NoReplica."""
        tried: list[int] = []
        while True:
            index = prefills.choose(key, exclude=tried, cached=held).index
            ticket = prefills.started(index, key)
            url = prefills.replicas[index].url
            try:
                return (
                    index,
                    ticket,
                    await send(
                        "prefill", "POST", f"{url}{path}", headers, json=body, stream=stream
                    ),
                )
            except UpstreamError as err:
                prefills.finished(index, 0, ticket)
                if err.unreachable:
                    prefills.set_healthy(index, False)
                    tried.append(index)
                if not err.unreachable or len(tried) > 1 or not prefills.healthy(tried):
                    raise

    async def relay(path: str, request: Request):
        raw = await read_body(request, config.max_body_bytes)
        try:  # strict JSON: NaN and Infinity are no JSON numbers, and could not be sent on
            body = json.loads(raw, parse_constant=not_json, parse_float=finite_float)
        except (ValueError, RecursionError) as err:  # malformed, or nested past the parser's depth
            return error_response(
                400, f"the request body is not valid JSON: {str(err)[:200]}", "BadRequestError"
            )
        if not isinstance(body, dict):
            return error_response(
                400,
                f"the request body must be a JSON object, got {type(body).__name__}",
                "BadRequestError",
            )
        headers = end_to_end(request.headers.items(), REQUEST_OWN)
        streaming = body.get("stream") is True
        # with one replica up there is nothing to decide: no question asked
        ask = config.routing == "cache" and len(prefills.healthy()) > 1
        held = await held_tokens(body, headers) if ask else None
        try:
            if decodes is None:  # a prefill-only tier: the replica's own answer
                index, ticket, answer = await to_replica(
                    {k: v for k, v in body.items() if k != "kv_transfer_params"},
                    path,
                    headers,
                    prompt_key(body),
                    stream=streaming,
                    held=held,
                )
                return await pass_answer(answer, lambda n=0: prefills.finished(index, n, ticket))
            index, ticket, prefill = await to_replica(
                prefill_body(body), path, headers, prompt_key(body), stream=False, held=held
            )
        except NoReplica as err:
            return error_response(503, str(err), "ServiceUnavailable")
        except UpstreamError as err:
            return error_response(err.status, err.message)
        prefill_url = prefills.replicas[index].url
        try:
            answer = prefill.json() if prefill.status_code == 200 else None
        except ValueError:
            answer = None
        prefills.finished(index, cached_tokens_of(answer), ticket)
        if prefill.status_code != 200:
            return passthrough(prefill)
        if not isinstance(answer, dict):
            return error_response(502, "the prefill server's answer is not a JSON object")
        params = answer.get("kv_transfer_params")
        params = params if isinstance(params, dict) else None
        try:
            decode_index = decodes.choose(None).index
        except NoReplica as err:
            await drop_transfer(prefill_url, params)
            return error_response(503, str(err).replace("prefill", "decode"), "ServiceUnavailable")
        decodes.started(decode_index)
        url = f"{decodes.replicas[decode_index].url}{path}"
        try:
            decode = await send(
                "decode", "POST", url, headers, json=decode_body(body, params), stream=streaming
            )
        except UpstreamError as err:
            decodes.finished(decode_index)
            await drop_transfer(prefill_url, params)
            return error_response(err.status, err.message)
        if decode.status_code != 200:
            await decode.aread()
            await decode.aclose()
            await drop_transfer(prefill_url, params)
            decodes.finished(decode_index)
            return passthrough(decode)
        return await pass_answer(decode, lambda n=0: decodes.finished(decode_index))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await relay("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await relay("/v1/chat/completions", request)

    @app.get("/v1/models")
    async def models(request: Request):
        table = decodes or prefills
        up = table.healthy()
        if not up:
            return error_response(503, "no upstream server is healthy", "ServiceUnavailable")
        side = "decode" if decodes is not None else "prefill"
        try:
            return passthrough(
                await send(
                    side,
                    "GET",
                    f"{table.replicas[up[0]].url}/v1/models",
                    end_to_end(request.headers.items(), REQUEST_OWN),
                )
            )
        except UpstreamError as err:
            return error_response(err.status, err.message)

    @app.get("/health")
    async def health():
        await check_health()
        bad = [
            name
            for name, t in (("prefill", prefills), ("decode", decodes))
            if t is not None and not t.healthy()
        ]
        return JSONResponse(
            {"status": "ok" if not bad else f"unhealthy: {', '.join(bad)}"},
            status_code=503 if bad else 200,
        )

    @app.get("/metrics")
    async def metrics():
        return Response(route_metrics(prefills, decodes), media_type=CONTENT_TYPE_LATEST)

    return app
