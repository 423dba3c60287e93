"""Prefill in wavepp, decode in vLLM: the KV each stage wrote, loaded by vLLM's CPU build through
`wavepp.connectors.vllm`, gives the same greedy tokens as vLLM computing the prompt itself, and
vLLM really used it: its cached-token count covers all but the last block's remainder, and a
poisoned transfer (valid checksum, wrong values) changes its output.

vLLM runs in its own venv (`.venv-vllm`, made by the Makefile: it pins its own packages) as a
subprocess, `tests/connectors/vllm_decode.py`, with `src/` on its path."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save

from wavepp.engine import Engine
from wavepp.kv_transfer import DirectoryStore
from wavepp.store import resolve_model

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_BLOCK = 32          # vLLM's CPU attention takes blocks of a multiple of 32 tokens

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM venv (.venv-vllm): `make test` makes it")]


def poison(store: DirectoryStore, transfer_id: str) -> None:
    """Replace every stage's values with noise, keeping the files well formed and their checksums
    right: only the decode's output can tell."""
    gen = torch.Generator().manual_seed(0)
    for part in store.read(transfer_id).parts:
        tensors = load_file(str(part.path))
        tensors["value"] = torch.randn(tensors["value"].shape, generator=gen, dtype=tensors["value"].dtype) * 4
        manifest = {k: v for k, v in part.manifest.items() if k not in ("stage_id", "file", "bytes", "sha256")}
        store.write_part(transfer_id, part.stage_id, save(tensors), manifest)


def test_vllm_decodes_from_wavepps_kv(tmp_path):
    model = resolve_model("smollm2")
    rng = random.Random(3)
    prefixes = [[rng.randrange(100, 40000) for _ in range(100)] for _ in range(2)]
    prompts = [prefixes[i % 2] + [rng.randrange(100, 40000) for _ in range(20 + 7 * i)] for i in range(6)]
    store_dir = tmp_path / "store"
    keep = tmp_path / "keep"
    with Engine(str(model), pp=2, dtype="float32", kv_store=str(store_dir), profile_waves=False) as engine:
        results = [engine.submit(p, kv_transfer=f"t{i}").result(timeout=300) for i, p in enumerate(prompts)]
        assert [r.num_cached_tokens for r in results[2:]] == [96] * 4     # reused blocks are exported too
        for r in results:                      # every stage's part lands beside execution
            for _ in range(200):
                if all((store_dir / r.kv_transfer["transfer_id"] / f"stage{s}.json").exists() for s in range(2)):
                    break
                time.sleep(0.05)
        # the engine removes what it wrote at shutdown: keep a copy for the decode side
        shutil.copytree(store_dir, keep)
    store = DirectoryStore(keep)
    shutil.copytree(keep / "t0", keep / "p0")
    request = json.loads((keep / "p0" / "request.json").read_text())
    assert request["token_ids"] == prompts[0]
    poison(store, "p0")
    # a poisoned transfer, and one that was never written (the decode side computes)
    extra = [{"token_ids": prompts[0], "transfer_id": "p0"}, {"token_ids": prompts[1], "transfer_id": "never"}]
    spec = {"model": str(model), "store": str(keep), "dtype": "float32", "max_tokens": 16,
            "requests": [{"token_ids": p, "transfer_id": f"t{i}"} for i, p in enumerate(prompts)] + extra}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([str(VLLM_PYTHON), str(ROOT / "tests" / "connectors" / "vllm_decode.py"),
                          str(tmp_path / "spec.json")], capture_output=True, text=True, env=env, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-3000:] + out.stderr[-3000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))
    n = len(prompts)
    # the same 16 greedy tokens as vLLM alone, and wavepp's first token is vLLM's
    assert got["handed_off"][:n] == got["alone"][:n]
    assert [a[0] for a in got["alone"][:n]] == [r.first_token_id for r in results]
    # loaded from outside: every whole block but the one holding the last prompt token
    assert got["cached_alone"] == [0] * (n + 2)
    assert got["cached_handed_off"][:n] == [(len(p) - 1) // VLLM_BLOCK * VLLM_BLOCK for p in prompts]
    # a poisoned transfer is loaded (same count) and changes the decode
    assert got["cached_handed_off"][n] == got["cached_handed_off"][0]
    assert got["handed_off"][n] != got["alone"][n]
    # a miss computes the prompt: nothing loaded, the right tokens
    assert got["cached_handed_off"][n + 1] == 0 and got["handed_off"][n + 1] == got["alone"][n + 1]
