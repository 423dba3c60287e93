"""Two `wavepp serve --kv-events-config` replicas (PP=2, stage 1's cache a quarter of stage 0's)
in the index of a real KV router: Dynamo's standalone KV indexer (`python -m dynamo.indexer`,
PyPI ai-dynamo-runtime, in its own venv .venv-dynamo), which subscribes to each replica's
stream and hashes the token ids itself. After prompts go to one replica, the indexer's matched
tokens for each replica are that replica's /v1/cache_query answer; when stage 1 of a replica
evicts a prefix that its stage 0 still holds, the indexer's score for it drops to 0 there. With
a host tier under the pools, the indexer's GPU match is the part every stage's pool holds and
its CPU match (the GPU one continued through blocks announced as CPU) all that is reusable."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import VOCAB, ServerProcess
from tests.serve.kv_events_helpers import cached_tokens, settle
from wavepp.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
DYNAMO_PYTHON = ROOT / ".venv-dynamo" / "bin" / "python"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not DYNAMO_PYTHON.exists(), reason="no Dynamo venv (.venv-dynamo): `make test` makes it"
    ),
]
BS = 16
MODEL = "tiny"


class DynamoIndexer:
    def __init__(self):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [str(DYNAMO_PYTHON), "-m", "dynamo.indexer", "--port", self.url.rsplit(":", 1)[1]],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.post(f"{self.url}/query", json={"token_ids": [1], "model_name": MODEL})
                return
            except httpx.TransportError:
                assert self.proc.poll() is None, "the indexer exited"
                assert time.monotonic() < deadline, "the indexer did not start"
                time.sleep(0.2)

    def register(self, instance_id: int, endpoint: str) -> None:
        body = {
            "instance_id": instance_id,
            "endpoint": endpoint,
            "model_name": MODEL,
            "block_size": BS,
        }
        r = httpx.post(f"{self.url}/register", json=body, timeout=30)
        assert r.status_code in (200, 201), r.text

    def matched(self, prompt: list[int]) -> dict[int, int]:
        """Tokens of `prompt` each instance holds, by the indexer (instances it has none of: 0)."""
        body = {"token_ids": prompt, "model_name": MODEL}
        r = httpx.post(f"{self.url}/query", json=body, timeout=30)
        assert r.status_code == 200, r.text
        scores = r.json()["scores"]
        return {int(i): sum(by_rank.values()) for i, by_rank in scores.items()}

    def tiered(self, prompt: list[int]) -> dict[int, tuple[int, int]]:
        """Tokens of `prompt` each instance holds as the indexer walks its tiers: (GPU only, GPU
        then CPU)."""
        body = {"token_ids": prompt, "model_name": MODEL}
        r = httpx.post(f"{self.url}/query", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return {int(i): (m["gpu"], m["cpu"]) for i, m in r.json().get("instances", {}).items()}

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def replica(tiny_model, *args: str) -> tuple[ServerProcess, str]:
    port = free_port()
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "topic": "kv"}
    server = ServerProcess(
        tiny_model, "--stage-num-blocks", "96,24", "--kv-events-config", json.dumps(config), *args
    )
    return server, f"tcp://127.0.0.1:{port}"


def test_dynamos_index_of_two_replicas_is_what_every_stage_of_each_holds(tiny_model):
    indexer = DynamoIndexer()
    replicas = []
    try:
        for instance_id in (1, 2):
            server, endpoint = replica(tiny_model)
            replicas.append(server)
            indexer.register(instance_id, endpoint)
        time.sleep(1.0)  # its subscriptions reach the publishers
        rng = random.Random(5454)
        prompts = [[rng.randrange(VOCAB) for _ in range(8 * BS)] for _ in range(4)]
        a, b, c, d = prompts

        def agree(sent: list[list[int]]) -> dict:
            """Wait until the indexer's answer for every prompt is each replica's own."""
            for server in replicas:
                settle(server.url)
            want = {
                n: {i + 1: cached_tokens(s.url, p) for i, s in enumerate(replicas)}
                for n, p in enumerate(sent)
            }
            deadline = time.monotonic() + 30
            while True:
                got = {n: indexer.matched(p + [1]) for n, p in enumerate(sent)}
                got = {n: {i: m.get(i, 0) for i in (1, 2)} for n, m in got.items()}
                if got == want or time.monotonic() > deadline:
                    assert got == want
                    return got
                time.sleep(0.2)

        for prompt in (a, b, c):  # all to replica 1
            r = httpx.post(
                f"{replicas[0].url}/v1/completions", json={"prompt": prompt}, timeout=120
            )
            assert r.status_code == 200
        scores = agree([a, b, c])
        assert scores[0] == {1: 128, 2: 0}

        r = httpx.post(f"{replicas[0].url}/v1/completions", json={"prompt": d}, timeout=120)
        assert r.status_code == 200  # stage 1 of replica 1 gives up a's chain, stage 0 keeps it
        query = httpx.post(f"{replicas[0].url}/v1/cache_query", json={"prompt": a + [1]}).json()
        assert [s["cached_tokens"] for s in query["stages"]] == [128, 0]
        scores = agree([a, b, c, d])
        assert scores[0] == {1: 0, 2: 0} and scores[3] == {1: 128, 2: 0}

        r = httpx.post(f"{replicas[1].url}/v1/completions", json={"prompt": a}, timeout=120)
        assert r.status_code == 200
        scores = agree([a, b, c, d])
        assert scores[0] == {1: 0, 2: 128}
    finally:
        for server in replicas:
            server.stop()
        indexer.close()


def test_with_a_host_tier_dynamo_walks_gpu_then_cpu_to_what_the_leader_would_reuse(tiny_model):
    indexer = DynamoIndexer()
    server, endpoint = replica(tiny_model, "--host-kv-gib", "0.05")
    try:
        indexer.register(1, endpoint)
        time.sleep(1.0)  # its subscription reaches the publisher
        rng = random.Random(5455)
        prompts = [[rng.randrange(VOCAB) for _ in range(8 * BS)] for _ in range(4)]

        def agree(sent: list[list[int]]) -> list[tuple[int, int]]:
            """Wait until the indexer's (GPU, GPU+CPU) for every prompt is the replica's
            (pool, pool + host) tokens."""
            settle(server.url)
            want = []
            for prompt in sent:
                r = httpx.post(f"{server.url}/v1/cache_query", json={"prompt": prompt + [1]})
                tiers = r.json()["tiers"]
                want.append((tiers["pool"], tiers["pool"] + tiers["host"]))
            deadline = time.monotonic() + 30
            while True:
                got = [indexer.tiered(p + [1]).get(1, (0, 0)) for p in sent]
                if got == want or time.monotonic() > deadline:
                    assert got == want
                    return got
                time.sleep(0.2)

        def run(prompt: list[int]) -> None:
            r = httpx.post(f"{server.url}/v1/completions", json={"prompt": prompt}, timeout=120)
            assert r.status_code == 200

        for prompt in prompts:  # stage 1 (24 blocks) sends the first chain to its host tier
            run(prompt)
        tiers = agree(prompts)
        assert tiers[0] == (0, 128) and tiers[3] == (128, 128)
        run(prompts[0])  # loaded back: every pool holds it again, another chain goes down
        tiers = agree(prompts)
        assert tiers[0] == (128, 128)
        assert any(gpu < cpu for gpu, cpu in tiers[1:]), tiers
    finally:
        server.stop()
        indexer.close()
