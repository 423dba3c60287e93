"""Shared fixtures: tiny seeded checkpoints (make_model) and transformers as the outside reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from wavepp.random_checkpoint import HYBRID_ARCHS, MOE_ARCHS, make_model

ARCHS = ("llama", "qwen2", "qwen3")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls gain nothing from threads, and OpenMP threads that wait on a core busy
    with another process slow every op down by orders of magnitude."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """arch -> checkpoint dir: 4 layers, hidden 64, 4 heads / 2 KV heads, vocab 256."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_model(root / arch, arch=arch, seed=1) for arch in ARCHS}


@pytest.fixture(scope="session")
def tied_model(tmp_path_factory) -> Path:
    """A Llama with tied embeddings (no lm_head.weight in the file) and 3 KV groups."""
    return make_model(
        tmp_path_factory.mktemp("tied") / "llama",
        arch="llama",
        num_layers=3,
        hidden_size=48,
        num_heads=6,
        num_kv_heads=2,
        tie_word_embeddings=True,
        seed=2,
    )


@pytest.fixture(scope="session")
def llama3_model(tmp_path_factory) -> Path:
    """A tiny Llama whose config asks for Llama 3.1 RoPE scaling."""
    path = make_model(tmp_path_factory.mktemp("llama3") / "llama", arch="llama", seed=3)
    config = json.loads((path / "config.json").read_text())
    config["rope_parameters"] = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="session")
def moe_models(tmp_path_factory) -> dict[str, object]:
    """arch -> 4-layer tiny checkpoint (GLM-5 with index_topk 64: more than any prompt here,
    so its attention is dense and exact), plus "glm_moe_dsa/topk4": GLM-5 keeping 4 keys."""
    root = tmp_path_factory.mktemp("moe")
    models = {arch: make_model(root / arch, arch=arch, seed=1, index_topk=64) for arch in MOE_ARCHS}
    models["glm_moe_dsa/topk4"] = make_model(
        root / "glm_topk4", arch="glm_moe_dsa", seed=2, index_topk=4
    )
    return models


@pytest.fixture(scope="session")
def hybrid_models(tmp_path_factory) -> dict[str, Path]:
    """arch -> 4-layer tiny checkpoint of each hybrid family (Kimi-Linear: KDA, KDA, MLA, KDA)."""
    root = tmp_path_factory.mktemp("hybrid")
    return {arch: make_model(root / arch, arch=arch, seed=5) for arch in HYBRID_ARCHS}


_HF_CACHE: dict = {}


def hf_logits(path: Path, token_ids: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """transformers' logits at every position of `token_ids`: [len, vocab] fp32."""
    import transformers

    key = (str(path), dtype)
    if key not in _HF_CACHE:
        transformers.logging.set_verbosity_error()
        _HF_CACHE[key] = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    with torch.no_grad():
        return _HF_CACHE[key](torch.tensor([token_ids])).logits[0].float()


def random_prompt(length: int, vocab_size: int = 256, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=gen).tolist()
