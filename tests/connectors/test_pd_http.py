"""The three processes of disaggregated serving, over HTTP: `wavepp serve --pp 2 --kv-store`,
vLLM's OpenAI server (its CPU build, in `.venv-vllm`) with the WavePPConnector, and `wavepp route`
in front. 16 prompts sharing prefixes through the router decode the same 16 greedy tokens as vLLM
computing them itself; vLLM reports every whole block but the last as loaded from outside, in
each answer and in its metrics; a poisoned transfer changes vLLM's output; a transfer never
written makes vLLM compute."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save

from tests.serve.conftest import ServerProcess
from wavepp.bench.http import wait_until_healthy
from wavepp.runtime.launch import free_port
from wavepp.kv_transfer import DirectoryStore, TransferError
from wavepp.store import resolve_model

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_BLOCK = 32

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM venv (.venv-vllm): `make test` makes it")]


def poison(store: DirectoryStore, transfer_id: str) -> None:
    """Replace every stage's values with noise, the files well formed and their checksums right:
    only the decode's output can tell."""
    gen = torch.Generator().manual_seed(0)
    for part in store.read(transfer_id).parts:
        tensors = load_file(str(part.path))
        tensors["value"] = torch.randn(tensors["value"].shape, generator=gen, dtype=tensors["value"].dtype) * 4
        manifest = {k: v for k, v in part.manifest.items() if k not in ("stage_id", "file", "bytes", "sha256")}
        store.write_part(transfer_id, part.stage_id, save(tensors), manifest)


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

        # vLLM really reads the KV: a poisoned copy (values replaced, checksums rewritten) loads
        # and changes the output; a transfer never written computes the prompt, correctly
        with httpx.Client(timeout=600) as client:
            r = client.post(f"{prefill.url}/v1/completions", json={
                "model": model, "prompt": prompts[0], "max_tokens": 1, "logprobs": 1,
                "kv_transfer_params": {"do_remote_decode": True}}).json()
            assert r["choices"][0]["logprobs"]["tokens"][0] == alone[0]["choices"][0]["logprobs"]["tokens"][0]
            transfer_id = r["kv_transfer_params"]["transfer_id"]
            kv = DirectoryStore(store)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    kv.read(transfer_id)
                    break
                except TransferError:
                    time.sleep(0.1)
            shutil.copytree(store / transfer_id, store / "poisoned")
            poison(kv, "poisoned")
            decoded = {}
            for name, prompt in (("poisoned", prompts[0]), ("never", prompts[1])):
                decoded[name] = client.post(f"http://127.0.0.1:{vllm_port}/v1/completions", json={
                    "model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 1,
                    "kv_transfer_params": {"transfer_id": name}}).json()
        tokens = {k: v["choices"][0]["logprobs"]["tokens"] for k, v in decoded.items()}
        cached = {k: v["usage"]["prompt_tokens_details"]["cached_tokens"] for k, v in decoded.items()}
        assert cached["poisoned"] == (len(prompts[0]) - 1) // VLLM_BLOCK * VLLM_BLOCK
        assert tokens["poisoned"] != alone[0]["choices"][0]["logprobs"]["tokens"]
        assert cached["never"] == 0 and tokens["never"] == alone[1]["choices"][0]["logprobs"]["tokens"]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        prefill.stop()
