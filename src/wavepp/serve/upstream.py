"""What `wavepp route` does with an upstream's messages (serve/router.py): the headers a proxy
passes on, its own errors, an answer passed through or streamed, the cached tokens it reports;
and the router's /metrics."""

from __future__ import annotations

import http.cookiejar
import logging
import math

import httpx
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from wavepp.openai_http import APIError
from wavepp.routing import ReplicaTable

log = logging.getLogger("wavepp.serve.router")

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


class UpstreamError(Exception):
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
    return JSONResponse(APIError(status, message, type_=kind).body(), status_code=status)


def route_metrics(prefills: ReplicaTable, decodes: ReplicaTable | None) -> bytes:
    """The router's /metrics: per replica its requests, the tokens its answers said were
    cached, what it has in flight and whether it is up; the routing decisions by reason."""
    families = []
    for side, table in (("prefill", prefills), ("decode", decodes)):
        if table is None:
            continue
        for name, doc, kind, value in (
            ("wavepp_route_requests", "requests sent to the server", "counter", "num_requests"),
            (
                "wavepp_route_cached_tokens",
                "prompt tokens its answers said were cached",
                "counter",
                "cached_tokens",
            ),
            ("wavepp_route_in_flight", "requests in flight there", "gauge", "in_flight"),
            ("wavepp_route_up", "1 while its health checks pass", "gauge", "healthy"),
        ):
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, doc, labels=["side", "server"]
            )
            for replica in table.replicas:
                family.add_metric([side, replica.url], float(getattr(replica, value)))
            families.append(family)
    decisions = CounterMetricFamily(
        "wavepp_route_decisions", "prefill replicas chosen, by why", labels=["policy", "reason"]
    )
    for reason, n in sorted(prefills.decisions.items()):
        decisions.add_metric([prefills.policy, reason], n)
    families.append(decisions)
    queries = CounterMetricFamily(
        "wavepp_route_cache_queries", "the cache policy's questions to the replicas (all at once)"
    )
    queries.add_metric([], prefills.num_queries)
    families.append(queries)
    seconds = CounterMetricFamily(
        "wavepp_route_cache_query_seconds", "time the cache policy waited for the replicas' answers"
    )
    seconds.add_metric([], prefills.query_seconds)
    families.append(seconds)

    class _Collector:
        def collect(self):
            yield from families

    registry = CollectorRegistry()
    registry.register(_Collector())
    return generate_latest(registry)
