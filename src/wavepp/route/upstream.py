"""What `wavepp route` does with an upstream's messages (route/router.py): the headers a proxy
passes on, its own errors, an answer passed through or streamed, the cached tokens it reports,
the strict JSON it takes from a client, and the body each side gets (`prefill_body`,
`decode_body`)."""

from __future__ import annotations

import http.cookiejar
import logging
import math

import httpx
from fastapi.responses import JSONResponse, Response, StreamingResponse

from wavepp.openai_http import TOKEN_CHOICE_FIELDS, APIError, json_error

log = logging.getLogger("wavepp.route.router")

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
REQUEST_OWN = frozenset(
    {"host", "content-length", "content-type", "content-encoding", "accept-encoding"}
)
RESPONSE_OWN = frozenset({"content-length", "content-encoding", "date", "server"})


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


class NoCookies(http.cookiejar.DefaultCookiePolicy):
    """The upstream client stores no cookie: each is the client's whose answer carried it."""

    def set_ok(self, cookie, request) -> bool:
        return False


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


class UpstreamError(Exception):
    """An upstream that could not be reached (`unreachable`: marked down, another tried) or did
    not answer in time; `status` (502 or 504) and `message` (naming the side, never its
    address) are what the client gets."""

    def __init__(self, side: str, err: httpx.HTTPError, timeout_s: float):
        timed_out = isinstance(err, httpx.TimeoutException)
        self.unreachable = isinstance(err, (httpx.ConnectError, httpx.ConnectTimeout))
        self.status = 504 if timed_out and not self.unreachable else 502
        self.message = (
            f"the {side} server did not answer within {timeout_s:g} s"
            if self.status == 504
            else f"the {side} server could not be reached ({type(err).__name__})"
        )


async def pass_answer(upstream: httpx.Response, done) -> Response:
    """An upstream's 200 (streamed through when it streams) or error; `done(cached_tokens)`
    once it is over."""
    if "text/event-stream" not in upstream.headers.get("content-type", ""):
        await upstream.aread()
        await upstream.aclose()
        try:
            answer = upstream.json() if upstream.status_code == 200 else None
        except ValueError:
            answer = None
        done(cached_tokens_of(answer))
        return passthrough(upstream)

    async def chunks():
        try:
            async for chunk in upstream.aiter_bytes():
                yield chunk
        except httpx.HTTPError as err:  # the upstream went away mid-stream: the stream ends
            log.warning("route: an upstream stream broke: %r", err)
        finally:
            await upstream.aclose()  # a client that leaves closes the upstream stream too
            done()

    response = StreamingResponse(chunks(), status_code=upstream.status_code)
    add_headers(response, upstream)
    return response


def cached_tokens_of(answer) -> int:
    try:
        return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)
    except (TypeError, KeyError, ValueError):
        return 0


def not_json(name: str):
    raise ValueError(f"{name} is not a JSON number")


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is past a double's range")
    return value


def add_headers(response: Response, upstream: httpx.Response) -> None:
    for key, value in end_to_end(upstream.headers, RESPONSE_OWN):
        if key.lower() != "content-type" or "content-type" not in response.headers:
            response.headers.append(key, value)


def passthrough(resp: httpx.Response) -> Response:
    """An upstream's answer as it is: status, body and end-to-end headers."""
    response = Response(resp.content, status_code=resp.status_code)
    add_headers(response, resp)
    return response


def error_response(status: int, message: str, kind: str = "BadGateway") -> JSONResponse:
    """The router's own refusal, in the OpenAI error format the server writes (APIError)."""
    return json_error(APIError(status, message, type_=kind))
