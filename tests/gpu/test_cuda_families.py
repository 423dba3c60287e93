"""Every family on CUDA: the MoE, latent-attention and hybrid families through the CUDA path
(`cuda_kernels`), against transformers and against the CPU. Skipped without a CUDA device.

    Engine, fp32    PP = 1 and 2: first tokens equal to transformers' (on the CPU, fp32; DSA's
                    ties broken as wavepp breaks them), logprobs within 1e-3, prefixes reused
                    (Kimi-Linear resumes from its snapshots)
    Engine, bf16    PP = 2 on the CUDA path (the grouped GEMM, MLA absorbed) against the CPU
                    engine in bf16: logprobs within 0.1, first tokens equal wherever the CPU's
                    top two are more than 0.1 apart
    the choice      each stage on CUDA runs what `cuda_kernels` chooses, shown in its kernels

tests/models/test_cuda_path.py runs the same kernels' torch code on the CPU against
transformers, and tests/models/test_device_plumbing.py each family's stage on the meta device.
Run: `.venv/bin/python -m pytest -q tests/gpu` on a machine with a CUDA build of torch.
"""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import assert_near_cpu
from tests.models.test_moe_families import reference_logits, stable_topk
from tests.prompts import two_prefix_prompts
from wavepp.engine import Engine
from wavepp.random_checkpoint import HYBRID_ARCHS, MOE_ARCHS, make_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

VOCAB = 256
FAMILIES = (*MOE_ARCHS, *HYBRID_ARCHS)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """arch -> tiny checkpoint; GLM-5 keeps 4 keys a query, so its selection is sparse."""
    root = tmp_path_factory.mktemp("families")
    models = {arch: make_model(root / arch, arch=arch, seed=5, index_topk=4) for arch in FAMILIES}
    # bf16 rounding changes which 4 keys an indexer keeps: bf16 compares a dense selection
    models["glm_moe_dsa/dense"] = make_model(
        root / "glm_dense", arch="glm_moe_dsa", seed=5, index_topk=64
    )
    return models


def _prompts(seed: int) -> list[list[int]]:
    return two_prefix_prompts(VOCAB, seed, per_prefix=3)


def _engine(path, pp: int, dtype: str, device: str) -> Engine:
    return Engine(
        str(path),
        pp=pp,
        dtype=dtype,
        device=device,
        block_size=4,
        stage_num_blocks=[64] * pp,
        layer_split="even",  # GLM-5's boundary before a shared layer: the top-k crosses it
    )


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("arch", FAMILIES)
def test_engine_fp32_on_cuda_matches_transformers(families, arch, pp):
    prompts = _prompts(seed=len(arch) + pp)
    with stable_topk():
        reference = [reference_logits(families[arch], p)[-1].log_softmax(-1) for p in prompts]
    with _engine(families[arch], pp, "float32", "cuda") as engine:
        kernels = engine.stage_kernels
        first = engine.prefill(prompts)
        again = engine.prefill(prompts)
    assert all("linear=linear" in k for k in kernels), kernels
    for results in (first, again):
        for r, lp in zip(results, reference):
            assert r.ok, r.error
            assert r.first_token_id == int(lp.argmax())
            assert abs(r.first_token_logprob - float(lp.max())) <= 1e-3
    assert sum(r.num_cached_tokens for r in again) > sum(r.num_cached_tokens for r in first)


@pytest.mark.parametrize(
    "arch", [a if a != "glm_moe_dsa" else "glm_moe_dsa/dense" for a in FAMILIES]
)
def test_engine_bf16_on_cuda_matches_the_cpu_engine(families, arch):
    prompts = _prompts(seed=7 + len(arch))
    with _engine(families[arch], 1, "bfloat16", "cpu") as engine:
        cpu = engine.prefill(prompts)
    with _engine(families[arch], 2, "bfloat16", "cuda") as engine:
        kernels = engine.stage_kernels
        gpu = engine.prefill(prompts)
    # every family here has MoE layers; all but MiniMax-M2 and Qwen3-MoE have MLA
    assert all("moe=grouped" in k for k in kernels), kernels
    mla = arch not in ("minimax_m2", "qwen3_moe")
    assert all(("mla=absorbed" in k) == mla for k in kernels), kernels
    assert_near_cpu(cpu, gpu)
