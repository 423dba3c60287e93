"""`wavepp route`: one OpenAI endpoint in front of prefill replicas (wavepp) and decode servers
(vLLM with `wavepp.connectors.vllm`), as disaggregated serving runs them.

Each request goes to one prefill replica, picked by the routing policy (replica_table.py: cache,
the default, by what each replica holds on all its stages, asked of them before the request
(POST /v1/cache_query); approx, the router's own record of what it sent where; least-load;
round-robin), among the replicas that pass their health checks (GET /health every
`health_interval_s`; one that fails leaves the rotation, and comes back when it passes again).
A replica that cannot be reached is marked down and the request goes to another, once. Without
decode servers the router serves the replicas' own answers (the first token), streams included:
a prefill-only tier routed. With several decode servers, the one with the fewest requests in
flight decodes.

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
import math
import time

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from wavepp.openai_http import APIError, answer_api_errors, read_body
from wavepp.route.config import RouteConfig
from wavepp.route.metrics import render_metrics
from wavepp.route.prefix_record import prompt_key
from wavepp.route.replica_table import NoReplica, ReplicaTable, held_value
from wavepp.route.upstream import (
    REQUEST_OWN,
    NoCookies,
    UpstreamError,
    cached_tokens_of,
    decode_body,
    end_to_end,
    error_response,
    finite_float,
    not_json,
    pass_answer,
    passthrough,
    prefill_body,
)

log = logging.getLogger(__name__)

# what a cache query carries of a request: its prompt or its messages (as /tokenize takes them)
QUERY_FIELDS = ("prompt", "messages", "add_generation_prompt", "continue_final_message")


class RequestRouter:
    """The router and what it owns: its replica tables (prefill; decode when there are decode
    servers), the one upstream client, the health task (started and stopped with the app) and
    the metrics read from the tables. `app` is the FastAPI app that serves it; `transport`
    replaces the network (tests). Requests mutate the tables (in flight, records, health) and
    nothing else: no state is kept between requests."""

    def __init__(self, config: RouteConfig, transport: httpx.AsyncBaseTransport | None = None):
        self.config = config
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
            transport=transport,
            cookies=http.cookiejar.CookieJar(policy=NoCookies()),
        )
        self.prefills = ReplicaTable(config.prefill, config.routing)
        self.decodes = ReplicaTable(config.decode, "least-load") if config.decode else None
        self._health_task: asyncio.Task | None = None
        # server URL -> when the health check whose answer stands was sent (one per server)
        self._health_asked: dict[str, float] = {}
        self.app = self._build_app()

    # -- the routes

    async def completions(self, request: Request):
        return await self.relay("/v1/completions", request)

    async def chat_completions(self, request: Request):
        return await self.relay("/v1/chat/completions", request)

    async def relay(self, path: str, request: Request):
        """One client request through the two steps of the module docstring; the response (an
        upstream's, passed through or streamed, or the router's own refusal)."""
        body = await self._client_body(request)
        headers = end_to_end(request.headers.items(), REQUEST_OWN)
        # with one replica up there is nothing to decide: no question asked
        asks = self.config.routing == "cache" and len(self.prefills.healthy()) > 1
        held = await self._held_tokens(body, headers) if asks else None
        try:
            if self.decodes is None:  # a prefill-only tier: the replica's own answer
                return await self._prefill_only(body, path, headers, held)
            index, ticket, prefill = await self._to_replica(
                prefill_body(body), path, headers, prompt_key(body), stream=False, held=held
            )
        except NoReplica as err:
            return error_response(503, str(err), "ServiceUnavailable")
        except UpstreamError as err:
            return error_response(err.status, err.message)
        prefill_url = self.prefills.replicas[index].url
        answer = _json_answer(prefill)
        self.prefills.finished(index, cached_tokens_of(answer), ticket)
        if prefill.status_code != 200:
            return passthrough(prefill)
        if not isinstance(answer, dict):
            return error_response(502, "the prefill server's answer is not a JSON object")
        params = answer.get("kv_transfer_params")
        params = params if isinstance(params, dict) else None
        return await self._decode(body, path, headers, prefill_url, params)

    async def models(self, request: Request):
        """The decode side's model list (the prefill side's without decode servers)."""
        table = self.decodes or self.prefills
        up = table.healthy()
        if not up:
            return error_response(503, "no upstream server is healthy", "ServiceUnavailable")
        side = "decode" if self.decodes is not None else "prefill"
        url = f"{table.replicas[up[0]].url}/v1/models"
        try:
            headers = end_to_end(request.headers.items(), REQUEST_OWN)
            return passthrough(await self._send(side, "GET", url, headers))
        except UpstreamError as err:
            return error_response(err.status, err.message)

    async def health(self):
        """Checks every server now; 503 naming the side where none is up."""
        await self.check_health()
        bad = [
            name
            for name, t in (("prefill", self.prefills), ("decode", self.decodes))
            if t is not None and not t.healthy()
        ]
        return JSONResponse(
            {"status": "ok" if not bad else f"unhealthy: {', '.join(bad)}"},
            status_code=503 if bad else 200,
        )

    async def metrics(self):
        return Response(render_metrics(self.prefills, self.decodes), media_type=CONTENT_TYPE_LATEST)

    # -- health

    async def check_health(self) -> None:
        """GET /health of every server; mutates the tables' health (a change is logged). The
        periodic checks and GET /health's run side by side: an answer to a check sent before
        the one whose answer stands is dropped, so a check that waited out a dead link cannot
        take out a server a newer check found back."""
        for table in (t for t in (self.prefills, self.decodes) if t is not None):
            for i, replica in enumerate(table.replicas):
                asked = time.monotonic()
                ok = await self._answers_health(replica.url)
                if asked < self._health_asked.get(replica.url, -math.inf):
                    continue  # a newer check's answer stands
                self._health_asked[replica.url] = asked
                if ok != replica.healthy:
                    log.warning("route: %s is %s", replica.url, "back" if ok else "down")
                table.set_healthy(i, ok)

    # -- private: the app and its lifespan

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="wavepp route", lifespan=self._lifespan)
        app.state.router = self
        answer_api_errors(app)
        app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"])
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/metrics", self.metrics, methods=["GET"])
        return app

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: FastAPI):
        self._health_task = asyncio.create_task(self._health_loop())
        yield
        self._health_task.cancel()
        await self.client.aclose()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            try:
                await self.check_health()
            except Exception:  # the next round tries again
                log.exception("route: health check failed")

    async def _answers_health(self, url: str) -> bool:
        try:
            response = await self.client.get(f"{url}/health", timeout=self.config.health_timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    # -- private: the steps of a request

    async def _client_body(self, request: Request) -> dict:
        """The client's body as a JSON object; APIError 413 past the limit, 400 for one that is
        not strict JSON (NaN and Infinity are no JSON numbers, and could not be sent on)."""
        raw = await read_body(request, self.config.max_body_bytes)
        try:
            body = json.loads(raw, parse_constant=not_json, parse_float=finite_float)
        except (ValueError, RecursionError) as err:  # malformed, or nested past the parser's depth
            raise APIError(
                400,
                f"the request body is not valid JSON: {str(err)[:200]}",
                type_="BadRequestError",
            ) from None
        if not isinstance(body, dict):
            raise APIError(
                400,
                f"the request body must be a JSON object, got {type(body).__name__}",
                type_="BadRequestError",
            )
        return body

    async def _prefill_only(self, body: dict, path: str, headers, held) -> Response:
        """The replica's own answer (streamed when asked), without any client kv_transfer_params."""
        index, ticket, answer = await self._to_replica(
            {k: v for k, v in body.items() if k != "kv_transfer_params"},
            path,
            headers,
            prompt_key(body),
            stream=body.get("stream") is True,
            held=held,
        )
        return await pass_answer(answer, lambda n=0: self.prefills.finished(index, n, ticket))

    async def _decode(self, body: dict, path: str, headers, prefill_url: str, params) -> Response:
        """Step 2 to the least loaded decode server; step 3 (the transfer dropped) when it
        fails. Mutates the decode table's in-flight count until the answer is over."""
        decodes = self.decodes
        try:
            index = decodes.choose(None).index
        except NoReplica as err:
            await self._drop_transfer(prefill_url, params)
            return error_response(503, str(err).replace("prefill", "decode"), "ServiceUnavailable")
        decodes.started(index)
        url = f"{decodes.replicas[index].url}{path}"
        stream = body.get("stream") is True
        try:
            decode = await self._send(
                "decode", "POST", url, headers, json=decode_body(body, params), stream=stream
            )
        except UpstreamError as err:
            decodes.finished(index)
            await self._drop_transfer(prefill_url, params)
            return error_response(err.status, err.message)
        if decode.status_code != 200:
            await decode.aread()
            await decode.aclose()
            await self._drop_transfer(prefill_url, params)
            decodes.finished(index)
            return passthrough(decode)
        return await pass_answer(decode, lambda n=0: decodes.finished(index))

    async def _to_replica(self, body: dict, path: str, headers, key, *, stream: bool, held=None):
        """Send to a prefill replica by the policy; one that cannot be reached is marked down
        and another tried, once. -> (replica index, the table's ticket, response); raises
        UpstreamError or NoReplica (then nothing stays in flight)."""
        prefills, tried = self.prefills, []
        while True:
            index = prefills.choose(key, exclude=tried, cached=held).index
            ticket = prefills.started(index, key)
            url = f"{prefills.replicas[index].url}{path}"
            try:
                return (
                    index,
                    ticket,
                    await self._send("prefill", "POST", url, headers, json=body, stream=stream),
                )
            except UpstreamError as err:
                prefills.finished(index, 0, ticket)
                if err.unreachable:
                    prefills.set_healthy(index, False)
                    tried.append(index)
                if not err.unreachable or len(tried) > 1 or not prefills.healthy(tried):
                    raise

    async def _held_tokens(self, body: dict, headers) -> dict[int, float]:
        """The cache policy's question to every healthy replica: how many of this request's
        tokens it holds on all its stages (POST /v1/cache_query); 0 for one that does not
        answer in `query_timeout_s` (it is not marked down for that: its health check decides).
        -> {replica: the share of the prompt it holds}; counts the query in the table."""
        query = {k: body[k] for k in QUERY_FIELDS if k in body}
        up = self.prefills.healthy()
        t0 = time.perf_counter()
        shares = await asyncio.gather(*(self._held_share(i, query, headers) for i in up))
        self.prefills.note_query(time.perf_counter() - t0)
        return dict(zip(up, shares))

    async def _held_share(self, index: int, query: dict, headers) -> float:
        url = f"{self.prefills.replicas[index].url}/v1/cache_query"
        try:
            r = await self.client.post(
                url, json=query, headers=headers, timeout=self.config.query_timeout_s
            )
            if r.status_code != 200:
                return 0.0
            answer = r.json()
            return held_value(answer) / max(1, int(answer["num_tokens"]))
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return 0.0

    async def _send(self, side: str, method: str, url: str, headers, *, stream=False, **kwargs):
        """One upstream request; UpstreamError (naming the side, not the URL) if it fails."""
        try:
            return await self.client.send(
                self.client.build_request(method, url, headers=headers, **kwargs), stream=stream
            )
        except httpx.HTTPError as err:
            log.warning("route: %s %s failed: %r", method, url, err)
            raise UpstreamError(side, err, self.config.timeout_s) from None

    async def _drop_transfer(self, prefill_url: str, params: dict | None) -> None:
        """The decode side failed: the replica that prefilled drops its transfer (best effort)."""
        transfer_id = (params or {}).get("transfer_id")
        if not isinstance(transfer_id, str):
            return
        try:
            await self.client.delete(
                f"{prefill_url}/v1/kv_transfers/{transfer_id}", timeout=self.config.drop_timeout_s
            )
        except httpx.HTTPError as err:
            log.warning(
                "route: the prefill server did not drop KV transfer %s: %r", transfer_id, err
            )


def _json_answer(response: httpx.Response):
    """A 200's JSON (None for another status, or a body that is not JSON)."""
    try:
        return response.json() if response.status_code == 200 else None
    except ValueError:
        return None
