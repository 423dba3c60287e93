"""Two real replicas (`wavepp serve --pp 2`, the tiny model, stage 1's cache smaller than stage
0's) behind `wavepp route --routing cache`, no decode servers (a prefill-only tier): each group's
later prompts land on the replica that holds its prefix on every stage (the answers' cached
tokens say so) and their first tokens are transformers'; a prefix evicted on one stage of a
replica (stage 0 still holds it) moves its group to the other replica; a replica stopped
mid-run: its requests fail over, none lost."""

from __future__ import annotations

import random

import httpx
import pytest

from tests.serve.conftest import ServerProcess, app_in_thread, hf_logprobs
from wavepp.route.config import RouteConfig
from wavepp.route.router import RequestRouter

pytestmark = pytest.mark.slow

PREFIX, SUFFIX = 64, 8  # 4 blocks of 16 shared, then a partial block of its own


def test_cache_routing_follows_what_every_stage_of_a_replica_holds(tiny_model):
    replicas = [ServerProcess(tiny_model, "--stage-num-blocks", "64,12") for _ in range(2)]
    rng = random.Random(11)
    prefixes = [[rng.randrange(256) for _ in range(PREFIX)] for _ in range(4)]

    def prompt(group: int) -> list[int]:
        return prefixes[group] + [rng.randrange(256) for _ in range(SUFFIX)]

    try:
        config = RouteConfig(
            tuple(r.url for r in replicas), (), routing="cache", health_interval_s=0.5
        )
        with app_in_thread(RequestRouter(config).app) as url, httpx.Client(timeout=120) as client:

            def complete(base, ids):
                r = client.post(
                    f"{base}/v1/completions", json={"prompt": ids, "max_tokens": 1, "logprobs": 1}
                )
                assert r.status_code == 200, r.text
                return r.json()

            def cached(answer) -> int:
                return answer["usage"]["prompt_tokens_details"]["cached_tokens"]

            def where(ids) -> list[int]:
                """Each replica's all-stage and per-stage cached tokens of `ids`."""
                out = []
                for r in replicas:
                    q = client.post(f"{r.url}/v1/cache_query", json={"prompt": ids}).json()
                    out.append((q["cached_tokens"], [s["cached_tokens"] for s in q["stages"]]))
                return out

            for group in range(4):  # nothing held anywhere: by load, in turn
                assert cached(complete(url, prompt(group))) == 0
            holder = {}
            for group in range(4):
                ids = prompt(group)
                views = where(ids)
                holder[group] = next(i for i, (tokens, _) in enumerate(views) if tokens == PREFIX)
                answer = complete(url, ids)
                assert cached(answer) == PREFIX  # it went where its prefix is
                best = hf_logprobs(tiny_model, ids)[-1].max().item()
                assert answer["choices"][0]["logprobs"]["token_logprobs"][0] == pytest.approx(
                    best, abs=1e-3
                )
            assert sorted(holder.values()) == [0, 0, 1, 1]

            # group 0's prefix on the other replica too, then evicted on stage 1 of its holder
            x, y = holder[0], 1 - holder[0]
            assert cached(complete(replicas[y].url, prompt(0))) == 0
            for _ in range(2):  # 8 new blocks: stage 1 (12 blocks) gives up its oldest, group 0's
                complete(replicas[x].url, [rng.randrange(256) for _ in range(PREFIX)])
            views = where(prompt(0))
            assert views[x][1][0] == PREFIX and views[x][1][1] < PREFIX  # stage 0 still holds it
            assert views[x][0] < PREFIX and views[y][0] == PREFIX
            moved = complete(url, prompt(0))
            assert cached(moved) == PREFIX  # the other replica: it holds the prefix on all stages
            held = client.get(f"{replicas[x].url}/metrics").text
            assert 'wavepp_stage_cache_blocks_total{kind="evicted",stage="0"} 0.0' in held
            evicted = [
                float(line.rsplit(" ", 1)[1])
                for line in held.splitlines()
                if line.startswith('wavepp_stage_cache_blocks_total{kind="evicted",stage="1"}')
            ]
            assert evicted and evicted[0] >= 4  # stage 1 gave up group 0's four blocks

            # a replica stopped mid-run: what would go there fails over, none lost
            replicas[y].stop()
            answers = [complete(url, prompt(g)) for g in range(4)]
            assert len(answers) == 4 and all(a["choices"] for a in answers)
            metrics = client.get(f"{url}/metrics").text
            assert 'wavepp_route_decisions_total{policy="cache",reason="prefix"}' in metrics
            assert "wavepp_route_cache_query_seconds_total" in metrics
    finally:
        for r in replicas:
            r.stop()


def test_a_cache_query_answers_what_every_stage_holds_and_refuses_bad_prompts(server):
    with httpx.Client(timeout=60) as client:
        rng = random.Random(20261206)  # a prompt no other test of this server sends
        ids = [rng.randrange(256) for _ in range(3 * 16 + 5)]
        cold = client.post(f"{server.url}/v1/cache_query", json={"prompt": ids}).json()
        assert cold["object"] == "cache_query" and cold["num_tokens"] == len(ids)
        assert cold["cached_tokens"] == 0 and len(cold["stages"]) == 2
        r = client.post(f"{server.url}/v1/completions", json={"prompt": ids, "max_tokens": 1})
        assert r.status_code == 200
        warm = client.post(f"{server.url}/v1/cache_query", json={"prompt": ids}).json()
        assert warm["cached_tokens"] == 48 and [s["cached_tokens"] for s in warm["stages"]] == [
            48,
            48,
        ]
        assert set(warm["load"]) == {"num_waiting", "num_running"}
        text = client.post(f"{server.url}/v1/cache_query", json={"prompt": "hello"}).json()
        assert text["num_tokens"] > 0
        for bad, field in (
            ({"prompt": []}, "prompt"),
            ({"prompt": [10**9]}, "prompt"),
            ({"prompt": 5}, "prompt"),
            ({"messages": "hi"}, "messages"),
        ):
            r = client.post(f"{server.url}/v1/cache_query", json=bad)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, (bad, r.text)
