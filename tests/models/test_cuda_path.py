"""The CUDA path's code on the CPU: every family through the kernels `cuda_kernels` chooses,
against transformers' own model code.

`cuda_kernels` gives a stage the paths it runs on a GPU (F.linear, SDPA for GQA where varlen
needs the GPU itself, MLA absorbed over the latent cache, the grouped GEMM for MoE in bf16,
torch's elementwise ops); here each of them runs its torch implementation on the CPU:

    choice     what each family gets in fp32 and bf16, and when the grouped GEMM does not apply
    experts    the grouped GEMM (torch's CPU build runs it as a loop) equals the sorted loop
    fp32       every family with prefix hits and a stage split, each computed position within
               1e-4 of transformers (as tests/models/test_moe_families.py and
               test_kimi_linear.py check the CPU path); DSA keeping 4 keys with ties broken
               as wavepp breaks them; the MoE families with either experts kernel
    bf16       the bf16 choice (grouped GEMM, absorbed MLA) near the fp32 reference

tests/models/test_device_plumbing.py runs the same choice on the meta device, every op watched.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.models.conftest import hf_logits, random_prompt
from tests.models.test_kimi_linear import Chain
from tests.models.test_moe_families import _prefix_reuse_scenario, reference_logits, stable_topk
from wavepp.models import ChunkSpec, LocalPipeline, load_model_config
from wavepp.models.kernels import Kernels, choose_kernels, cuda_kernels
from wavepp.models.kernels.experts import run_experts
from wavepp.random_checkpoint import MOE_ARCHS, make_model

FP32_ATOL = 1e-4


@pytest.fixture(scope="module")
def kimi(hybrid_models):
    """KDA, KDA, MLA, KDA: a stage split in two puts KDA and MLA on each side."""
    return hybrid_models["kimi_linear"]


def test_the_cuda_choice_of_each_family(moe_models, tiny_models, kimi):
    """Nothing is timed; each kind gets torch's GPU kernel: GQA SDPA (varlen needs a GPU),
    MLA absorbed, MoE the grouped GEMM in bf16 only (its CUDA kernel takes bf16), torch's
    elementwise ops (the C++ ones are CPU kernels)."""
    for path in (tiny_models["qwen3"], *(moe_models[a] for a in MOE_ARCHS), kimi):
        config = load_model_config(path)
        moe = any(layer.mlp.kind == "moe" for layer in config.layers)
        for dtype, experts in ((torch.float32, "sorted"), (torch.bfloat16, "grouped")):
            kernels = cuda_kernels(config, dtype, torch.device("cpu"))
            assert (kernels.linear, kernels.attention, kernels.elementwise, kernels.mla) == (
                "linear",
                "sdpa",
                "torch",
                "absorbed",
            )
            assert kernels.moe == (experts if moe else "sorted")


def test_a_stage_on_cuda_takes_the_cuda_path_with_the_pins_applied(moe_models, monkeypatch):
    """`choose_kernels` on a CUDA device times nothing (it gets no model to time); fp32 asks
    the device nothing, so it runs here. A linear or attention path pinned in the environment
    wins, as on the CPU."""
    config = load_model_config(moe_models["minimax_m2"])
    cuda = torch.device("cuda")
    monkeypatch.setenv("WAVEPP_LINEAR_KERNEL", "matmul")
    monkeypatch.setenv("WAVEPP_ATTENTION_KERNEL", "chunked")
    pinned = choose_kernels(None, config, torch.float32, cuda)
    assert pinned.kernels == Kernels("matmul", "chunked", "torch", mla="absorbed", moe="sorted")
    assert pinned.attention is not None and pinned.attention.seconds == {}
    monkeypatch.delenv("WAVEPP_LINEAR_KERNEL")
    monkeypatch.delenv("WAVEPP_ATTENTION_KERNEL")
    chosen = choose_kernels(None, config, torch.float32, cuda)
    assert chosen.kernels == cuda_kernels(config, torch.float32) and chosen.linear.gflops == {}
    deepseek = load_model_config(moe_models["deepseek_v3"])  # MLA: no GQA kernel to choose
    assert choose_kernels(None, deepseek, torch.float32, cuda).attention is None


def test_the_grouped_gemm_needs_widths_of_whole_16_bytes(tmp_path):
    """An expert width of 36 bf16 values (72 bytes) is not one the CUDA kernel takes: the
    sorted loop runs instead."""
    path = make_model(tmp_path / "m", arch="qwen3_moe", moe_intermediate_size=36, seed=1)
    config = load_model_config(path)
    assert cuda_kernels(config, torch.bfloat16).moe == "sorted"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_experts_equal_the_sorted_loop(dtype):
    """20 rows over 6 experts, two of them empty (one first, one last): the same rows."""
    gen = torch.Generator().manual_seed(0)
    experts = torch.tensor([1] * 5 + [2] * 3 + [3] * 9 + [4] * 3)
    routed = torch.randn(20, 16, generator=gen).to(dtype)
    gate_up = (torch.randn(6, 2 * 24, 16, generator=gen) / 4).to(dtype)
    down = (torch.randn(6, 16, 24, generator=gen) / 5).to(dtype)
    project = Kernels().project
    sorted_out = run_experts("sorted", routed, experts, gate_up, down, project)
    grouped_out = run_experts("grouped", routed, experts, gate_up, down, project)
    assert grouped_out.dtype == dtype and grouped_out.shape == (20, 16)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(grouped_out, sorted_out, atol=tol, rtol=0)
    # each row goes through its own expert: expert 4's rows come out otherwise from expert 3
    wrong = run_experts("grouped", routed, experts.clamp(max=3), gate_up, down, project)
    assert (wrong[-3:] - sorted_out[-3:]).abs().max() > 10 * tol


@pytest.mark.parametrize("experts", ["sorted", "grouped"])
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_families_on_the_cuda_path_match_transformers(moe_models, arch, experts):
    kernels = cuda_kernels(load_model_config(moe_models[arch]), torch.float32)
    _prefix_reuse_scenario(moe_models[arch], 2, dataclasses.replace(kernels, moe=experts))


def test_dsa_small_topk_on_the_cuda_path_matches_transformers_tie_aware(moe_models):
    """GLM-5 keeping 4 of up to 37 keys: the indexer's selection as SDPA's mask over the
    latent rows (test_moe_families.py's tie-aware check, whose ties it asserts)."""
    path = moe_models["glm_moe_dsa/topk4"]
    kernels = cuda_kernels(load_model_config(path), torch.float32)
    with stable_topk():
        _prefix_reuse_scenario(path, 3, kernels)


def test_dense_family_on_the_cuda_path_matches_transformers(tiny_models):
    path = tiny_models["qwen3"]
    prompt = random_prompt(46, seed=2)
    reference = hf_logits(path, prompt)
    pipe = LocalPipeline(
        path,
        dtype=torch.float32,
        num_stages=2,
        num_blocks=16,
        block_size=4,
        kernels=cuda_kernels(load_model_config(path), torch.float32),
    )
    start = 0
    for end in (5, 18, 46):
        logits = pipe.prefill_chunks([("r", prompt[start:end])])[0]
        torch.testing.assert_close(logits, reference[end - 1], atol=FP32_ATOL, rtol=0)
        start = end


def test_kimi_linear_on_the_cuda_path_matches_transformers(kimi):
    """KDA's chunked scan and MLA absorbed (no RoPE), resuming from a snapshot at 16."""
    import transformers

    prompt = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(7))
    model = transformers.AutoModelForCausalLM.from_pretrained(kimi, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(prompt[None]).logits[0]
    chain = Chain(kimi, 2, kernels=cuda_kernels(load_model_config(kimi), torch.float32))
    table = tuple(range(4))
    first = chain.run(ChunkSpec(0, 16, table, "a", state_saves=((16, 0),)), prompt[:16])
    second = chain.run(ChunkSpec(16, 24, table, "a", state_in=0), prompt[16:])
    torch.testing.assert_close(torch.cat((first, second)), want, rtol=0, atol=FP32_ATOL)


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen3_moe"])
def test_bf16_cuda_path_close_to_the_fp32_reference(moe_models, arch):
    """bf16 with the bf16 choice (the grouped GEMM; MLA absorbed): each chunk's greedy token
    the reference's wherever its top two are more than 0.2 apart, its logprob within 0.1 (the
    criteria of test_moe_families.py's bf16 test)."""
    path = moe_models[arch]
    kernels = cuda_kernels(load_model_config(path), torch.bfloat16)
    assert kernels.moe == "grouped"
    pipe = LocalPipeline(
        path, dtype=torch.bfloat16, num_stages=2, num_blocks=16, block_size=4, kernels=kernels
    )
    prompt = random_prompt(37, seed=31)
    start, logits = 0, []
    for end in (13, 24, 37):
        logits.append(pipe.prefill_chunks([("r", prompt[start:end])])[0].log_softmax(-1))
        start = end
    reference = reference_logits(path, prompt)[[12, 23, 36]].log_softmax(-1)
    for got, expected in zip(logits, reference):
        best, runner_up = expected.topk(2).values
        if best - runner_up > 0.2:
            assert int(got.argmax()) == int(expected.argmax())
        assert abs(float(got.max()) - float(best)) < 0.1
