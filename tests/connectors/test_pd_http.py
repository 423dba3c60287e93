"""The three processes of disaggregated serving, over HTTP: `wavepp serve --pp 2 --kv-store`,
vLLM's OpenAI server with the WavePPConnector, and `wavepp route` in front. 16 prompts sharing
prefixes through the router decode the same 16 greedy tokens as vLLM computing them itself, and
vLLM reports every whole block but the last as loaded from outside."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import ServerProcess
from wavepp.bench.http import wait_until_healthy
from wavepp.runtime.launch import free_port
from wavepp.store import resolve_model

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_BLOCK = 32

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM venv (.venv-vllm): `make test` makes it")]


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **env})


def test_prefill_in_wavepp_decode_in_vllm_through_the_router(tmp_path):
    model = str(resolve_model("smollm2"))
    store = tmp_path / "store"
    prefill = ServerProcess(Path(model), "--kv-store", str(store), start_timeout_s=300, debug=False)
    procs = []
    try:
        vllm_port, route_port = free_port(), free_port()
        config = {"kv_connector": "WavePPConnector", "kv_connector_module_path": "wavepp.connectors.vllm",
                  "kv_role": "kv_consumer", "kv_connector_extra_config": {"store": str(store)}}
        vllm = start([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                      "--port", str(vllm_port), "--dtype", "float32", "--block-size", str(VLLM_BLOCK),
                      "--no-enable-prefix-caching", "--max-model-len", "1024", "--enable-prompt-tokens-details",
                      "--kv-transfer-config", json.dumps(config)],
                     {"PYTHONPATH": str(ROOT / "src"), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                      "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "1"}, tmp_path / "vllm.log")
        procs.append(vllm)
        route = start([sys.executable, "-m", "wavepp.cli", "route", "--prefill", prefill.url,
                       "--decode", f"http://127.0.0.1:{vllm_port}", "--port", str(route_port)], {},
                      tmp_path / "route.log")
        procs.append(route)
        try:
            wait_until_healthy(f"http://127.0.0.1:{vllm_port}", vllm, timeout_s=900)
            wait_until_healthy(f"http://127.0.0.1:{route_port}", route, timeout_s=60)
        except RuntimeError as err:
            raise RuntimeError(f"{err}\n{(tmp_path / 'vllm.log').read_text()[-4000:]}") from None

        rng = random.Random(5)
        prefixes = [[rng.randrange(100, 40000) for _ in range(150)] for _ in range(4)]
        prompts = [prefixes[i % 4] + [rng.randrange(100, 40000) for _ in range(10 + 3 * i)] for i in range(16)]
        with httpx.Client(timeout=600) as client:
            def complete(url, prompt):
                r = client.post(f"{url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 16,
                                                                "temperature": 0, "logprobs": 1})
                assert r.status_code == 200, r.text
                return r.json()
            routed = [complete(f"http://127.0.0.1:{route_port}", p) for p in prompts]
            alone = [complete(f"http://127.0.0.1:{vllm_port}", p) for p in prompts]
            metrics = client.get(f"http://127.0.0.1:{vllm_port}/metrics").text
        for p, r, a in zip(prompts, routed, alone):
            assert r["choices"][0]["logprobs"]["tokens"] == a["choices"][0]["logprobs"]["tokens"]
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == (len(p) - 1) // VLLM_BLOCK * VLLM_BLOCK
            assert (a["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
        loaded = [line for line in metrics.splitlines()
                  if line.startswith("vllm:prompt_tokens_by_source_total") and "external_kv_transfer" in line]
        assert loaded and float(loaded[0].rsplit(" ", 1)[1]) == sum((len(p) - 1) // VLLM_BLOCK * VLLM_BLOCK
                                                                     for p in prompts)
        # each transfer is dropped once vLLM's request finished
        deadline = time.monotonic() + 10
        while any(store.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(store.iterdir()) == []
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        prefill.stop()
