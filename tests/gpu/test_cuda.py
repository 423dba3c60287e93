"""The CUDA path, against transformers and against the CPU path. Skipped without a CUDA device.

    attention kernels     every kernel on CUDA tensors vs the float64 reference attention
                          (fp32: 1e-4; bf16: 2e-2, as on the CPU)
    Engine, fp32          first tokens equal to transformers' (on the CPU, fp32), logprobs within
                          1e-3, at PP = 1 and PP = 2 (two GPUs: NCCL data plane; one: the
                          stages share it and activations cross through host memory)
    Engine, bf16          a SmolLM2-shaped tiny model (hidden 576, 9 heads / 3 KV heads of 64):
                          logprobs within 0.1 of the CPU engine's, first tokens equal wherever
                          the CPU's top two are more than 0.1 apart
    NCCL                  with two GPUs, backend nccl carries fp32 and bf16 activations

Run: `.venv/bin/python -m pytest -q tests/gpu` on a machine with a CUDA build of torch.
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.gpu.conftest import assert_near_cpu
from tests.models.test_attention_kernels import random_wave, reference
from wavepp.engine import Engine
from wavepp.models.kernels import ATTENTION_KERNELS, paged_attention, varlen_applies
from wavepp.random_checkpoint import make_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

VOCAB = 256
SMOL_VOCAB = 1024
NUM_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
CUDA = torch.device("cuda", 0)
# wave shapes: (num_cached, num_new) per chunk; one-token chunks, long prefixes, a cold chunk
WAVE = [(1536, 64), (1536, 1), (0, 40), (700, 129), (37, 1)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(
        tmp_path_factory.mktemp("tiny") / "llama",
        arch="llama",
        num_layers=4,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
        seed=21,
    )


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """SmolLM2-135M's layer shapes (tied embeddings, rope theta 1e5), 4 layers, a small vocab."""
    return make_model(
        tmp_path_factory.mktemp("smol") / "llama",
        arch="llama",
        num_layers=4,
        hidden_size=576,
        num_heads=9,
        num_kv_heads=3,
        intermediate_size=1536,
        vocab_size=SMOL_VOCAB,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        max_position_embeddings=2048,
        seed=22,
    )


def prompts_with_shared_prefixes(vocab: int, seed: int) -> list[list[int]]:
    """Three prefixes, four suffixes each (one a single token), and a repeat (fully cached)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(vocab) for _ in range(rng.randrange(40, 200))] for _ in range(3)]
    prompts = [
        p + [rng.randrange(vocab) for _ in range(n)] for n in (1, 17, 64, 90) for p in prefixes
    ]
    return prompts + [list(prompts[0])]


def transformers_logprobs(model_dir, prompts) -> list[torch.Tensor]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return [
            torch.log_softmax(model(torch.tensor([p])).logits[0, -1].float(), -1) for p in prompts
        ]


# ---- kernels ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_cpu_kernels_on_cuda_tensors_fp32(kernel):
    batch, query, key_cache, value_cache = random_wave(
        random.Random(kernel), WAVE, 3, 3, 64, torch.float32
    )
    out = paged_attention(
        query.to(CUDA),
        key_cache.to(CUDA),
        value_cache.to(CUDA),
        batch.to(CUDA),
        0.125,
        kernel=kernel,
    )
    assert out.device == CUDA and out.dtype == torch.float32
    torch.testing.assert_close(
        out.cpu().double(),
        reference(query, key_cache, value_cache, batch, 0.125),
        rtol=0,
        atol=1e-4,
    )


@pytest.mark.parametrize("kernel", ["varlen", "sdpa"])
@pytest.mark.parametrize(
    "heads", [(3, 3, 64), (2, 4, 128), (1, 1, 32)]
)  # (kv_heads, group, head_dim)
def test_cuda_kernels_bf16(kernel, heads):
    kv_heads, group, head_dim = heads
    if kernel == "varlen" and not varlen_applies(head_dim, torch.bfloat16, CUDA):
        pytest.skip("varlen FlashAttention needs compute capability 8.0 or later")
    batch, query, key_cache, value_cache = random_wave(
        random.Random(f"{kernel}{heads}"), WAVE, kv_heads, group, head_dim, torch.bfloat16
    )
    scale = head_dim**-0.5
    out = paged_attention(
        query.to(CUDA),
        key_cache.to(CUDA),
        value_cache.to(CUDA),
        batch.to(CUDA),
        scale,
        kernel=kernel,
    )
    assert out.device == CUDA and out.dtype == torch.bfloat16
    assert out.shape == (batch.num_tokens, kv_heads * group * head_dim)
    torch.testing.assert_close(
        out.cpu().double(),
        reference(query, key_cache, value_cache, batch, scale),
        rtol=0,
        atol=2e-2,
    )


# ---- the engine ------------------------------------------------------------------------------


@pytest.mark.parametrize("pp", [1, 2])
def test_engine_fp32_matches_transformers(tiny, pp):
    prompts = prompts_with_shared_prefixes(VOCAB, seed=pp)
    ref = transformers_logprobs(tiny, prompts)
    with Engine(str(tiny), pp=pp, dtype="float32", device="cuda") as engine:
        assert engine._core.stage.device == CUDA
        assert (
            engine._core.stage.kernel_choice.kernels.attention == "sdpa"
        )  # varlen is bf16 / fp16 only
        assert engine.runtime_config.backend == ("nccl" if pp == 2 and NUM_GPUS >= 2 else "gloo")
        results = engine.prefill(prompts)
        again = engine.prefill(prompts)  # now from the cache
    assert sum(r.num_cached_tokens for r in again) > sum(r.num_cached_tokens for r in results) > 0
    for r, lp in list(zip(results, ref)) + list(zip(again, ref)):
        assert r.ok, r.error
        assert r.first_token_id == int(lp.argmax())
        assert abs(r.first_token_logprob - float(lp.max())) <= 1e-3


def test_engine_bf16_matches_the_cpu_engine(smol):
    prompts = prompts_with_shared_prefixes(SMOL_VOCAB, seed=5)
    with Engine(str(smol), pp=1, dtype="bfloat16", device="cpu") as engine:
        cpu = engine.prefill(prompts)
    with Engine(str(smol), pp=2, dtype="bfloat16", device="cuda") as engine:
        expected = "varlen" if varlen_applies(64, torch.bfloat16, CUDA) else "sdpa"
        assert engine._core.stage.kernel_choice.kernels.attention == expected
        gpu = engine.prefill(prompts)
    assert_near_cpu(cpu, gpu)


@pytest.mark.skipif(NUM_GPUS >= 2, reason="two GPUs: nccl is allowed")
def test_nccl_on_one_gpu_is_refused_before_spawning(tiny):
    with pytest.raises(ValueError, match="NCCL refuses two ranks on one GPU"):
        Engine(str(tiny), pp=2, device="cuda", backend="nccl")


@pytest.mark.skipif(NUM_GPUS < 2, reason="NCCL between stages needs two GPUs")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nccl_data_plane_moves_activations(tiny, dtype):
    prompts = prompts_with_shared_prefixes(VOCAB, seed=9)
    ref = transformers_logprobs(tiny, prompts)
    with Engine(str(tiny), pp=2, dtype=dtype, device="cuda", backend="nccl") as engine:
        assert engine._cluster.channels.data_device == CUDA
        results = engine.prefill(prompts)
    tol = 1e-3 if dtype == "float32" else 0.1
    for r, lp in zip(results, ref):
        assert r.ok, r.error
        assert abs(r.first_token_logprob - float(lp.max())) <= tol
        top2 = torch.topk(lp, 2).values
        if dtype == "float32" or float(top2[0] - top2[1]) > 0.1:
            assert r.first_token_id == int(lp.argmax())
