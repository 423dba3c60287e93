"""`wavepp serve --kv-events-config` at PP=2 (the tiny model; stage 1's cache a quarter of
stage 0's), its stream decoded by vLLM's own classes in vLLM's venv: after admissions, after
evictions on stage 1 only, after a prefix comes back, after aborts and after a reset, the
blocks announced and not removed are, prompt by prompt, what /v1/cache_query says every stage
holds, and no other; the replay socket resends the same batches; /metrics has vLLM's load
names and the publisher's counters."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from tests.kv_events.test_wire import needs_vllm
from tests.serve.conftest import VOCAB, ServerProcess
from tests.serve.kv_events_helpers import (
    AnnouncedBlocks,
    VLLMSubscriber,
    cached_tokens,
    replay,
    settle,
)
from tests.serve.test_serve_edges import metric
from wavepp.runtime.launch import free_port

pytestmark = [pytest.mark.slow, needs_vllm]
BS = 16


def events_config(topic: str) -> tuple[str, str, str]:
    pub, rep = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{rep}",
        "topic": topic,
    }
    return json.dumps(config), f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"


def complete(url: str, prompt, timeout_s: float = 120) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=timeout_s
    )


def test_announced_blocks_are_what_every_stage_holds(tiny_model):
    config, endpoint, replay_endpoint = events_config("kv@replica-0")
    subscriber = VLLMSubscriber(endpoint, "kv@replica-0")
    try:
        server = ServerProcess(
            tiny_model, "--stage-num-blocks", "96,24", "--kv-events-config", config
        )
    except BaseException:
        subscriber.close()
        raise
    subscriber.ready()
    rng = random.Random(54)
    sent: list[list[int]] = []
    announced = AnnouncedBlocks(BS)

    def send(*prompts: list[int]) -> None:
        for prompt in prompts:
            assert complete(server.url, prompt).status_code == 200
            sent.append(prompt)

    def check(what: str) -> dict[int, int]:
        subscriber.wait_for(settle(server.url))
        announced.apply(subscriber.batches)
        held = {i: cached_tokens(server.url, p) for i, p in enumerate(sent)}
        assert {i: announced.num_tokens(p) for i, p in enumerate(sent)} == held, what
        assert announced.chained(sent) == len(announced.blocks), f"{what}: stray blocks"
        return held

    def group(n: int) -> list[list[int]]:  # prompts of 8 full blocks
        return [[rng.randrange(VOCAB) for _ in range(8 * BS)] for _ in range(n)]

    try:
        a, b, c, d = group(4)
        send(a, b, c)  # 24 full blocks: stage 1 holds them all, stage 0 too
        held = check("after admissions")
        assert held == {0: 128, 1: 128, 2: 128}
        send(d)  # stage 1 (24 blocks) gives up a's chain; stage 0 (96) keeps it
        held = check("after an eviction on stage 1 only")
        assert held[0] == 0 and held[3] == 128
        query = httpx.post(f"{server.url}/v1/cache_query", json={"prompt": a + [1]}).json()
        assert [s["cached_tokens"] for s in query["stages"]] == [128, 0]
        send(a)  # computed again on stage 1, leased from stage 0: announced again, root first
        held = check("after a prefix came back")
        assert held[4] == 128 and held[1] == 0  # b's chain went from stage 1 this time
        for timeout_s in (0.05, 0.02, 0.01, 0.005):  # clients that leave mid-prefill
            prompts = group(3)
            sent.extend(prompts)  # (some may finish first)
            try:
                complete(server.url, prompts, timeout_s)
            except httpx.TimeoutException:
                pass
        check("after aborts")
        aborted = 'wavepp_requests_total{outcome="aborted"}'
        assert metric(server, aborted) > 0  # the check ran with requests cut mid-prefill
        assert httpx.post(f"{server.url}/debug/reset", timeout=120).status_code == 200
        held = check("after a reset")
        assert set(held.values()) == {0} and announced.blocks == {}
        assert subscriber.batches[-1]["events"][-1] == {"type": "cleared"}

        resent = replay(replay_endpoint, 0)
        assert resent == subscriber.batches  # the same batches, seq by seq
        metrics = httpx.get(f"{server.url}/metrics").text
        for name in (
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            "wavepp_kv_events_dropped_total 0.0",
            f'wavepp_kv_events_published_total{{unit="batches"}} {len(resent)}.0',
        ):
            assert name in metrics, name
    finally:
        subscriber.close()
        server.stop()
