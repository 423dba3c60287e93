"""`wavepp route`: one OpenAI endpoint in front of a prefill server (wavepp) and a decode server
(vLLM with `wavepp.connectors.vllm`), as disaggregated serving runs them.

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

import contextlib
import http.cookiejar
import json
import logging
import math
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from wavepp.serve.errors import APIError
from wavepp.serve.limits import DEFAULT_MAX_BODY_BYTES, read_body
from wavepp.serve.sampling import TOKEN_CHOICE_FIELDS

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# set anew by whoever sends the message: the body is encoded again (its length and encoding
# change; httpx decodes what it reads), the host is the upstream's, date and server are uvicorn's
_REQUEST_OWN = frozenset(
    {"host", "content-length", "content-type", "content-encoding", "accept-encoding"}
)
_RESPONSE_OWN = frozenset({"content-length", "content-encoding", "date", "server"})
DROP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RouteConfig:
    prefill_url: str
    decode_url: str
    timeout_s: float = 600.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
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


def end_to_end(
    headers: httpx.Headers | list[tuple[str, str]], own: frozenset
) -> list[tuple[str, str]]:
    """The headers a proxy passes on: not hop-by-hop, not named by Connection, not `own`."""
    items = headers.multi_items() if isinstance(headers, httpx.Headers) else list(headers)
    named = {t.strip().lower() for k, v in items if k.lower() == "connection" for t in v.split(",")}
    return [
        (k, v)
        for k, v in items
        if (lk := k.lower()) not in HOP_BY_HOP and lk not in named and lk not in own
    ]


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    """The upstream client stores no cookie: each is the client's whose answer carried it."""

    def set_ok(self, cookie, request) -> bool:
        return False


class _Upstream(Exception):
    def __init__(self, side: str, err: httpx.HTTPError, timeout_s: float):
        timed_out = isinstance(err, httpx.TimeoutException)
        self.status = 504 if timed_out else 502
        self.message = (
            f"the {side} server did not answer within {timeout_s:g} s"
            if timed_out
            else f"the {side} server could not be reached ({type(err).__name__})"
        )


def build_router(config: RouteConfig, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The router's app; `transport` replaces the network (tests)."""
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
        transport=transport,
        cookies=http.cookiejar.CookieJar(policy=_NoCookies()),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await client.aclose()

    app = FastAPI(title="wavepp route", lifespan=lifespan)

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
            raise _Upstream(side, err, config.timeout_s) from None

    async def drop_transfer(params: dict | None) -> None:
        """The decode side failed: the prefill drops the transfer it wrote (best effort)."""
        transfer_id = (params or {}).get("transfer_id")
        if not isinstance(transfer_id, str):
            return
        try:
            await client.delete(
                f"{config.prefill_url}/v1/kv_transfers/{transfer_id}", timeout=DROP_TIMEOUT_S
            )
        except httpx.HTTPError as err:
            log.warning(
                "route: the prefill server did not drop KV transfer %s: %r", transfer_id, err
            )

    async def relay(path: str, request: Request):
        raw = await read_body(request, config.max_body_bytes)
        try:  # strict JSON: NaN and Infinity are no JSON numbers, and could not be sent on
            body = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
        except (ValueError, RecursionError) as err:  # malformed, or nested past the parser's depth
            return _error(
                400, f"the request body is not valid JSON: {str(err)[:200]}", "BadRequestError"
            )
        if not isinstance(body, dict):
            return _error(
                400,
                f"the request body must be a JSON object, got {type(body).__name__}",
                "BadRequestError",
            )
        headers = end_to_end(request.headers.items(), _REQUEST_OWN)
        try:
            prefill = await send(
                "prefill", "POST", f"{config.prefill_url}{path}", headers, json=prefill_body(body)
            )
        except _Upstream as err:
            return _error(err.status, err.message)
        if prefill.status_code != 200:
            return _passthrough(prefill)
        try:
            answer = prefill.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            return _error(502, "the prefill server's answer is not a JSON object")
        params = answer.get("kv_transfer_params")
        params = params if isinstance(params, dict) else None
        url = f"{config.decode_url}{path}"
        try:
            decode = await send(
                "decode",
                "POST",
                url,
                headers,
                json=decode_body(body, params),
                stream=body.get("stream") is True,
            )
        except _Upstream as err:
            await drop_transfer(params)
            return _error(err.status, err.message)
        if decode.status_code != 200 or body.get("stream") is not True:
            await decode.aread()
            await decode.aclose()
            if decode.status_code != 200:
                await drop_transfer(params)
            return _passthrough(decode)

        async def chunks():
            try:
                async for chunk in decode.aiter_bytes():
                    yield chunk
            except httpx.HTTPError as err:  # the decode side went away mid-stream: the stream ends
                log.warning("route: the decode stream broke: %r", err)
            finally:
                await decode.aclose()  # a client that leaves closes the decode stream too

        response = StreamingResponse(chunks(), status_code=200)
        _add_headers(response, decode)
        return response

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await relay("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await relay("/v1/chat/completions", request)

    @app.get("/v1/models")
    async def models(request: Request):
        try:
            return _passthrough(
                await send(
                    "decode",
                    "GET",
                    f"{config.decode_url}/v1/models",
                    end_to_end(request.headers.items(), _REQUEST_OWN),
                )
            )
        except _Upstream as err:
            return _error(err.status, err.message)

    @app.get("/health")
    async def health():
        bad = []
        for name, url in (("prefill", config.prefill_url), ("decode", config.decode_url)):
            try:
                if (await client.get(f"{url}/health")).status_code != 200:
                    bad.append(name)
            except httpx.HTTPError:
                bad.append(name)
        return JSONResponse(
            {"status": "ok" if not bad else f"unhealthy: {', '.join(bad)}"},
            status_code=503 if bad else 200,
        )

    return app


def _not_json(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is past a double's range")
    return value


def _add_headers(response: Response, upstream: httpx.Response) -> None:
    for key, value in end_to_end(upstream.headers, _RESPONSE_OWN):
        if key.lower() != "content-type" or "content-type" not in response.headers:
            response.headers.append(key, value)


def _passthrough(resp: httpx.Response) -> Response:
    """An upstream's answer as it is: status, body and end-to-end headers."""
    response = Response(resp.content, status_code=resp.status_code)
    _add_headers(response, resp)
    return response


def _error(status: int, message: str, kind: str = "BadGateway") -> JSONResponse:
    """The router's own refusal, in the OpenAI error format the server writes (APIError)."""
    return JSONResponse(APIError(status, message, type_=kind).body(), status_code=status)
