"""What the KV-cache-event tests share: a subscriber that decodes with vLLM's own classes (in
vLLM's venv, tests/kv_events/vllm_decode.py), the blocks its events leave announced, and how
many of a prompt's blocks they chain."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import httpx

from tests.kv_events.test_wire import DECODE, VLLM_PYTHON


class VLLMSubscriber:
    """vLLM's decoder subscribed to `endpoint` under `topic`, in its venv; `batches` fills as
    they come (the JSON vllm_decode.py prints). Started before the publisher's server (its
    imports take seconds: they overlap the server's start), then `ready()` once the server is
    up, before anything is published."""

    def __init__(self, endpoint: str, topic: str):
        self.proc = subprocess.Popen(
            [str(VLLM_PYTHON), str(DECODE), "--subscribe", endpoint, topic, "600"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.batches: list[dict] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def ready(self) -> "VLLMSubscriber":
        """Wait until it subscribed and its subscription reached the publisher."""
        assert self._ready.wait(300), "vLLM's decoder did not start"
        time.sleep(1.0)  # ZeroMQ's slow joiner (and a reconnect if it came up before the server)
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            if not line.startswith("{"):
                continue
            data = json.loads(line)
            if data.get("ready"):
                self._ready.set()
            else:
                self.batches.append(data)

    def wait_for(self, num_batches: int, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.batches) < num_batches:
            assert time.monotonic() < deadline, f"{len(self.batches)} of {num_batches} batches"
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def replay(endpoint: str, first: int) -> list[dict]:
    """The batches a replay socket resends from `first` on, decoded by vLLM's classes."""
    out = subprocess.run(
        [str(VLLM_PYTHON), str(DECODE), "--replay", endpoint, str(first)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines[-1] == {"end": True}
    return lines[:-1]


class AnnouncedBlocks:
    """The blocks a stream of decoded batches leaves announced: hash -> (parent, token ids)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.blocks: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self.num_batches = 0

    def apply(self, batches: list[dict]) -> None:
        bs = self.block_size
        for batch in batches[self.num_batches :]:
            assert batch["seq"] == self.num_batches, "a batch is missing"
            self.num_batches += 1
            for event in batch["events"]:
                if event["type"] == "stored":
                    assert event["block_size"] == bs and event["medium"] == "GPU"
                    assert event["lora_id"] is None and event["lora_name"] is None
                    parent, tokens = event["parent"], event["token_ids"]
                    assert len(tokens) == bs * len(event["block_hashes"])
                    for i, block_hash in enumerate(event["block_hashes"]):
                        assert parent is None or parent in self.blocks, "a child before its parent"
                        self.blocks[block_hash] = (parent, tuple(tokens[i * bs : (i + 1) * bs]))
                        parent = block_hash
                elif event["type"] == "removed":
                    for block_hash in event["block_hashes"]:
                        assert block_hash in self.blocks, "removed, never announced"
                        assert not any(p == block_hash for p, _ in self.blocks.values()), (
                            "a parent removed before its child"
                        )
                        del self.blocks[block_hash]
                else:
                    self.blocks.clear()

    def num_tokens(self, prompt: list[int]) -> int:
        """Tokens of `prompt` the announced chain covers from its start."""
        bs, parent, n = self.block_size, None, 0
        while (n + 1) * bs <= len(prompt):
            want = tuple(prompt[n * bs : (n + 1) * bs])
            match = [h for h, (p, t) in self.blocks.items() if p == parent and t == want]
            if not match:
                break
            parent, n = match[0], n + 1
        return n * bs

    def chained(self, prompts: list[list[int]]) -> int:
        """Announced blocks on the chains of `prompts` (every announced block should be)."""
        return len({h for p in prompts for h in self._chain(p)})

    def _chain(self, prompt: list[int]) -> list[int]:
        bs, parent, out = self.block_size, None, []
        for n in range(self.num_tokens(prompt) // bs):
            want = tuple(prompt[n * bs : (n + 1) * bs])
            parent = next(h for h, (p, t) in self.blocks.items() if p == parent and t == want)
            out.append(parent)
        return out


def published_batches(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith('wavepp_kv_events_published_total{unit="batches"}'):
            return int(float(line.split()[-1]))
    raise KeyError("wavepp_kv_events_published_total")


def settle(url: str) -> int:
    """Wait for the pipeline to be idle and every change to be published; the batches sent."""
    assert httpx.get(f"{url}/debug/integrity", timeout=120).status_code == 200  # idle
    last, deadline = -1, time.monotonic() + 30
    while True:
        time.sleep(0.3)  # a few polls of the stages
        now = published_batches(url)
        if now == last:
            return now
        assert time.monotonic() < deadline, "the events never settle"
        last = now


def cached_tokens(url: str, prompt: list[int]) -> int:
    """What /v1/cache_query says every stage holds of `prompt` (one more token asked, so that
    a request's last token, always computed, does not cap it)."""
    r = httpx.post(f"{url}/v1/cache_query", json={"prompt": prompt + [1]}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["cached_tokens"]
