"""`wavepp route` in front of several prefill replicas, against stand-in upstreams
(httpx.MockTransport): the routing policy picks the replica, a replica that cannot be reached is
failed over once and leaves the rotation until its health check passes, the decode side gets
the params of the replica that prefilled (and that one drops the transfer when decoding fails),
a prefill-only tier gets the replicas' own answers, and /metrics counts it all."""

from __future__ import annotations

import json

import httpx
from fastapi.testclient import TestClient

from wavepp.route.config import RouteConfig
from wavepp.route.router import RequestRouter

A, B, DECODE = "http://replica-a", "http://replica-b", "http://decode"


class Upstreams:
    def __init__(self, decode_status: int = 200):
        self.down: set[str] = set()
        self.seen: list[tuple[str, str, str, dict | None]] = []  # (host, method, path, body)
        self.decode_status = decode_status

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if f"http://{host}" in self.down:
            raise httpx.ConnectError("refused", request=request)
        body = json.loads(request.content) if request.content else None
        self.seen.append((host, request.method, request.url.path, body))
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if host == "decode":
            if self.decode_status != 200:
                return httpx.Response(self.decode_status, json={"error": {"message": "no"}})
            return httpx.Response(200, json={"choices": [{"text": "decoded"}]})
        if request.method == "DELETE":
            return httpx.Response(200, json={"deleted": True})
        cached = (
            32
            if any(
                s[0] == host and s[3] and s[3].get("prompt", [])[:32] == body["prompt"][:32]
                for s in self.seen[:-1]
            )
            else 0
        )
        answer = {
            "choices": [{"text": host}],
            "usage": {
                "prompt_tokens": len(body["prompt"]),
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
        if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            answer["kv_transfer_params"] = {"transfer_id": f"t-{host}-{len(self.seen)}"}
        return httpx.Response(200, json=answer)

    def hosts(self, path: str = "/v1/completions", method: str = "POST") -> list[str]:
        return [h for h, m, p, _ in self.seen if p == path and m == method]


def routed(routing: str, decode=(DECODE,), **upstream_options):
    upstreams = Upstreams(**upstream_options)
    config = RouteConfig((A, B), decode, routing=routing, health_interval_s=3600)
    return TestClient(
        RequestRouter(config, transport=httpx.MockTransport(upstreams)).app
    ), upstreams


def group(i: int, n: int = 3) -> list[int]:
    return [1000 * (i + 1)] * 32 + list(range(n))


def test_approx_keeps_a_group_on_the_replica_that_has_its_prefix():
    client, ups = routed("approx")
    for prompt in (group(0), group(1), group(0, 5), group(1, 6), group(0, 7)):
        assert client.post("/v1/completions", json={"prompt": prompt}).status_code == 200
    prefill = [h for h in ups.hosts() if h != "decode"]
    assert prefill[0] != prefill[1]  # nothing shared yet: by load, in turn
    assert prefill[2] == prefill[4] == prefill[0] and prefill[3] == prefill[1]
    decoded = [b for h, _, p, b in ups.seen if h == "decode"]
    assert [d["kv_transfer_params"]["transfer_id"].split("-")[2] for d in decoded] == [
        h.split("-")[1] for h in prefill
    ]  # each decode got the params of the replica that prefilled it
    metrics = client.get("/metrics").text
    assert 'wavepp_route_decisions_total{policy="approx",reason="prefix"} 3.0' in metrics
    assert f'wavepp_route_cached_tokens_total{{server="{A}",side="prefill"}} 64.0' in metrics


def test_a_replica_that_cannot_be_reached_is_failed_over_and_comes_back_with_its_health():
    client, ups = routed("round-robin")
    ups.down.add(A)
    answers = [client.post("/v1/completions", json={"prompt": group(i)}) for i in range(4)]
    assert [a.status_code for a in answers] == [200] * 4  # none lost
    assert [h for h in ups.hosts() if h != "decode"] == ["replica-b"] * 4
    metrics = client.get("/metrics").text
    assert f'wavepp_route_up{{server="{A}",side="prefill"}} 0.0' in metrics
    assert client.get("/health").status_code == 200  # B and the decode side are up
    ups.down.clear()
    client.get("/health")  # the health check sees A again
    client.post("/v1/completions", json={"prompt": group(5)})
    client.post("/v1/completions", json={"prompt": group(6)})
    assert "replica-a" in [h for h in ups.hosts() if h != "decode"][-2:]
    ups.down.update({A, B})
    resp = client.post("/v1/completions", json={"prompt": group(7)})
    assert resp.status_code == 502 and "prefill server could not be reached" in resp.text
    resp = client.post("/v1/completions", json={"prompt": group(8)})
    assert resp.status_code == 503 and "no prefill replica is healthy" in resp.text


def test_a_failed_decode_drops_the_transfer_on_the_replica_that_prefilled():
    client, ups = routed("round-robin", decode_status=500)
    for i in range(2):
        assert client.post("/v1/completions", json={"prompt": group(i)}).status_code == 500
    drops = [(h, p) for h, m, p, _ in ups.seen if m == "DELETE"]
    prefill = [h for h in ups.hosts() if h != "decode"]
    assert [h for h, _ in drops] == prefill and all(
        p.startswith("/v1/kv_transfers/t-") for _, p in drops
    )


def test_without_decode_servers_the_replicas_answer_themselves():
    client, ups = routed("least-load", decode=())
    body = {"prompt": group(0), "max_tokens": 1, "kv_transfer_params": {"transfer_id": "forged"}}
    resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "replica-a"
    sent = ups.seen[-1][3]
    assert "kv_transfer_params" not in sent and sent["prompt"] == group(
        0
    )  # a client's params stop here
    assert "decode" not in ups.hosts()
    assert client.get("/health").status_code == 200
