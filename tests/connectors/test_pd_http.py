"""The three processes of disaggregated serving, over HTTP: `wavepp serve --pp 2 --kv-store`,
vLLM's OpenAI server (its CPU build, in `.venv-vllm`) with the WavePPConnector, and `wavepp route`
in front. 16 prompts sharing prefixes through the router decode the same 8 greedy tokens as vLLM
computing them itself; vLLM reports every prompt token but the last as loaded from outside (the
last of its blocks partly filled), in each answer and in its metrics; a poisoned transfer changes
vLLM's output; a transfer never written makes vLLM compute."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.connectors.helpers import (
    NO_PROFILE,
    grouped_prompts,
    loaded_tokens,
    needs_vllm,
    poison,
    start_decode_and_route,
    stop,
    wait_for_transfer,
)
from tests.serve.conftest import ServerProcess
from wavepp.kv_transfer.directory import DirectoryStore
from wavepp.model_store import resolve_model

VLLM_BLOCK = 32
DECODE_TOKENS = 8  # greedy tokens decoded per prompt

pytestmark = [pytest.mark.slow, needs_vllm]


def test_prefill_in_wavepp_decode_in_vllm_through_the_router(tmp_path):
    model = str(resolve_model("smollm2"))
    store = tmp_path / "store"
    prefill = ServerProcess(
        Path(model), *NO_PROFILE, "--kv-store", str(store), start_timeout_s=300, debug=False
    )
    procs = []
    try:
        procs, vllm_url, route_url = start_decode_and_route(
            model,
            store,
            prefill.url,
            tmp_path,
            "--dtype",
            "float32",
            "--block-size",
            str(VLLM_BLOCK),
            "--max-model-len",
            "1024",
        )

        prompts = grouped_prompts()
        with httpx.Client(timeout=600) as client:

            def complete(url, prompt):
                r = client.post(
                    f"{url}/v1/completions",
                    json={
                        "model": model,
                        "prompt": prompt,
                        "max_tokens": DECODE_TOKENS,
                        "temperature": 0,
                        "logprobs": 1,
                    },
                )
                assert r.status_code == 200, r.text
                return r.json()

            routed = [complete(route_url, p) for p in prompts]
            alone = [complete(vllm_url, p) for p in prompts]
            metrics = client.get(f"{vllm_url}/metrics").text
        for p, r, a in zip(prompts, routed, alone):
            assert r["choices"][0]["logprobs"]["tokens"] == a["choices"][0]["logprobs"]["tokens"]
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == len(p) - 1
            assert (a["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
        assert loaded_tokens(metrics) == sum(len(p) - 1 for p in prompts)
        # each transfer is dropped once vLLM's request finished
        deadline = time.monotonic() + 10
        while any(store.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(store.iterdir()) == []

        # vLLM really reads the KV: a poisoned copy (values replaced, checksums rewritten) loads
        # and changes the output; a transfer never written computes the prompt, correctly
        with httpx.Client(timeout=600) as client:
            r = client.post(
                f"{prefill.url}/v1/completions",
                json={
                    "model": model,
                    "prompt": prompts[0],
                    "max_tokens": 1,
                    "logprobs": 1,
                    "kv_transfer_params": {"do_remote_decode": True},
                },
            ).json()
            assert (
                r["choices"][0]["logprobs"]["tokens"][0]
                == alone[0]["choices"][0]["logprobs"]["tokens"][0]
            )
            transfer_id = r["kv_transfer_params"]["transfer_id"]
            kv = DirectoryStore(store)
            wait_for_transfer(kv, transfer_id)
            shutil.copytree(store / transfer_id, store / "poisoned")
            poison(kv, "poisoned")
            decoded = {}
            for name, prompt in (("poisoned", prompts[0]), ("never", prompts[1])):
                decoded[name] = client.post(
                    f"{vllm_url}/v1/completions",
                    json={
                        "model": model,
                        "prompt": prompt,
                        "max_tokens": DECODE_TOKENS,
                        "temperature": 0,
                        "logprobs": 1,
                        "kv_transfer_params": {"transfer_id": name},
                    },
                ).json()
        tokens = {k: v["choices"][0]["logprobs"]["tokens"] for k, v in decoded.items()}
        cached = {
            k: v["usage"]["prompt_tokens_details"]["cached_tokens"] for k, v in decoded.items()
        }
        assert cached["poisoned"] == len(prompts[0]) - 1
        assert tokens["poisoned"] != alone[0]["choices"][0]["logprobs"]["tokens"]
        assert (
            cached["never"] == 0 and tokens["never"] == alone[1]["choices"][0]["logprobs"]["tokens"]
        )
    finally:
        stop(procs)
        prefill.stop()
