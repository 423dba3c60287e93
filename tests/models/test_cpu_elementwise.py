"""The C++ elementwise kernels (models/kernels/csrc/cpu_elementwise.cpp) against the torch ops they replace.

Tolerance: bf16 outputs equal to torch's but where an fp32 intermediate sits on a bf16
rounding boundary and the kernel's exp (or its sum of squares, in another order) lands on the
other side: there one bf16 ulp apart, and rare (at most 1 in 1,000 here). Below 1e-30 in size
(silu of x < -88, where torch's exp and the kernel's clamped one differ) only the absolute
difference counts.
"""

import pytest
import torch
import torch.nn.functional as F

from tests.models.conftest import hf_logits, random_prompt
from wavepp.models import LocalPipeline
from wavepp.models.kernels import Kernels
from wavepp.models.kernels import cpp as cpu_kernels
from wavepp.models.layers.mlp import SwiGLUMLP
from wavepp.models.layers.norm import RMSNorm
from wavepp.models.layers.rope import apply_rotary

CPP, TORCH = Kernels(elementwise="cpp"), Kernels(elementwise="torch")

needs_kernels = pytest.mark.skipif(
    cpu_kernels.elementwise_kernels() is None,
    reason="the C++ elementwise kernels could not be built here",
)


def ulps_apart(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """bf16 ulps between two bf16 tensors of finite values (as ordered integers)."""

    def ordered(t):
        bits = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(got) - ordered(want)).abs()


def assert_nearly_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == torch.bfloat16
    apart = ulps_apart(got, want)
    apart[(got.float() - want.float()).abs() <= 1e-30] = 0
    assert int(apart.max()) <= 1, float((got.float() - want.float()).abs().max())
    assert int((apart > 0).sum()) <= max(1, want.numel() // 1000)


def torch_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return F.silu(gate).mul(up)


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    scale = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps)
    return (x * scale).to(x.dtype) * weight


@needs_kernels
@pytest.mark.parametrize("rows,width", [(1, 8), (7, 100), (64, 1536), (300, 17)])
def test_silu_mul_rounds_as_torch(rows, width):
    gen = torch.Generator().manual_seed(rows + width)
    gate_up = (torch.randn(rows, 2 * width, generator=gen) * 3).to(torch.bfloat16)
    got = cpu_kernels.elementwise_kernels().silu_mul(gate_up)
    assert_nearly_equal(got, torch_silu_mul(gate_up))


@needs_kernels
def test_silu_mul_at_the_ends_of_the_range():
    # exp's argument clamped to fp32's normal range: silu of -100 and -1e4 is below 1e-34 in
    # size (torch's: smaller or 0), of 100 and 1e4 the argument; zeros stay zeros
    gate = torch.tensor(
        [[-1e4, -100.0, -88.0, -20.0, -1e-3, -0.0, 0.0, 1e-3, 20.0, 88.0, 100.0, 1e4]]
    )
    up = torch.full_like(gate, 1.5)
    gate_up = torch.cat([gate, up], dim=-1).to(torch.bfloat16)
    got = cpu_kernels.elementwise_kernels().silu_mul(gate_up)
    want = torch_silu_mul(gate_up)
    assert torch.isfinite(got.float()).all()
    assert_nearly_equal(got, want)


@needs_kernels
@pytest.mark.parametrize("rows,width", [(1, 64), (5, 576), (256, 576), (3, 33)])
def test_rms_norm_rounds_as_the_torch_module(rows, width):
    gen = torch.Generator().manual_seed(rows * width)
    x = (torch.randn(rows, width, generator=gen) * 2).to(torch.bfloat16)
    x[0, :] = 0.0  # a zero row: scale 1/sqrt(eps), output 0
    weight = (torch.rand(width, generator=gen) + 0.5).to(torch.bfloat16)
    got = cpu_kernels.elementwise_kernels().rms_norm(x, weight, 1e-5)
    assert_nearly_equal(got, torch_rms_norm(x, weight, 1e-5))
    assert torch.equal(got[0], torch.zeros(width, dtype=torch.bfloat16))


def torch_rotary(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotary_operands(rows, heads, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 8192, (rows,), generator=gen)
    freqs = pos[:, None].float() * (1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim))
    return freqs.cos().to(torch.bfloat16)[:, None], freqs.sin().to(torch.bfloat16)[:, None], gen


@needs_kernels
@pytest.mark.parametrize("rows,heads,dim", [(1, 1, 2), (5, 12, 64), (256, 12, 64), (9, 3, 40)])
def test_rotary_is_torchs_bit_for_bit(rows, heads, dim):
    cos, sin, gen = rotary_operands(rows, heads, dim, rows + heads)
    # q and k heads as a view into the fused projection's output (rows further apart), and
    # the same heads contiguous
    qkv = (torch.randn(rows, heads + 3, dim, generator=gen) * 4).to(torch.bfloat16)
    for x in (qkv[:, :heads], qkv[:, :heads].contiguous()):
        got = cpu_kernels.elementwise_kernels().rotary(x, cos, sin)
        assert got.is_contiguous() and torch.equal(got, torch_rotary(x, cos, sin))


@needs_kernels
def test_rotary_dispatch_and_refusals():
    cos, sin, gen = rotary_operands(6, 4, 16, 1)
    x = torch.randn(6, 4, 16, generator=gen).to(torch.bfloat16)
    assert torch.equal(apply_rotary(x, cos, sin, CPP), torch_rotary(x, cos, sin))  # the kernel
    # heads not contiguous (a transposed view) and fp32: torch's ops
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    assert torch.equal(apply_rotary(xt, cos, sin, CPP), torch_rotary(xt, cos, sin))
    assert torch.equal(
        apply_rotary(x.float(), cos.float(), sin.float(), CPP),
        torch_rotary(x.float(), cos.float(), sin.float()),
    )
    mod = cpu_kernels.elementwise_kernels()
    with pytest.raises(RuntimeError, match="contiguous"):
        mod.rotary(xt, cos, sin)
    with pytest.raises(RuntimeError, match="cos and sin"):
        mod.rotary(x, cos[:5], sin[:5])


@needs_kernels
def test_kernels_refuse_what_they_do_not_run():
    mod = cpu_kernels.elementwise_kernels()
    with pytest.raises(RuntimeError, match="bfloat16"):
        mod.silu_mul(torch.randn(4, 8))
    with pytest.raises(RuntimeError, match="even"):
        mod.silu_mul(torch.randn(4, 7).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="contiguous"):
        mod.rms_norm(
            torch.randn(8, 4).to(torch.bfloat16).t(), torch.ones(8, dtype=torch.bfloat16), 1e-5
        )
    with pytest.raises(RuntimeError, match="weight"):
        mod.rms_norm(
            torch.randn(4, 8).to(torch.bfloat16), torch.ones(7, dtype=torch.bfloat16), 1e-5
        )


@needs_kernels
def test_layers_take_the_kernels_for_bf16_and_torch_otherwise():
    gen = torch.Generator().manual_seed(0)
    norm = RMSNorm(48, 1e-6, torch.bfloat16)
    norm.weight.copy_((torch.rand(48, generator=gen) + 0.5).to(torch.bfloat16))
    mlp = SwiGLUMLP(48, 96, torch.bfloat16)
    mlp.gate_up_proj.copy_((torch.randn(192, 48, generator=gen) * 0.2).to(torch.bfloat16))
    mlp.down_proj.copy_((torch.randn(48, 96, generator=gen) * 0.2).to(torch.bfloat16))
    x = torch.randn(2, 10, 48, generator=gen).to(torch.bfloat16)  # leading dims kept
    assert TORCH.elementwise_in_use() == "torch"
    norm_torch, mlp_torch = norm(x, TORCH), mlp(x[0], TORCH)
    assert CPP.elementwise_in_use() == "cpp"
    assert_nearly_equal(norm(x, CPP), norm_torch)
    assert_nearly_equal(mlp(x[0], CPP), mlp_torch)
    # not bf16, or not contiguous: torch's ops, bit for bit
    assert torch.equal(
        norm(x.float().to(torch.bfloat16)[:, ::2], CPP),
        torch_rms_norm(x[:, ::2], norm.weight, 1e-6),
    )
    fp32 = RMSNorm(48, 1e-6, torch.float32)
    fp32.weight.copy_(norm.weight.float())
    assert torch.equal(fp32(x.float(), CPP), torch_rms_norm(x.float(), fp32.weight, 1e-6))


@needs_kernels
def test_bf16_model_with_the_kernels_keeps_the_fp32_reference(tiny_models):
    """The tolerance of test_models_vs_transformers.test_bf16_close_to_fp32_reference (top-5
    logprobs within 0.1 of transformers in fp32), with and without the kernels; the two bf16
    runs within 0.05 of each other."""
    prompt = random_prompt(60, seed=12)
    model = tiny_models["llama"]
    reference = hf_logits(model, prompt).log_softmax(-1)[-1]
    runs = {}
    for on, kernels in ((False, TORCH), (True, CPP)):
        pipe = LocalPipeline(
            model, dtype=torch.bfloat16, num_stages=2, num_blocks=32, block_size=4, kernels=kernels
        )
        runs[on] = pipe.prefill("r", prompt, chunk_sizes=[25, 35]).log_softmax(-1)
    top = reference.topk(5).indices
    for logprobs in runs.values():
        assert (logprobs[top] - reference[top]).abs().max() < 0.1
    assert (runs[True][top] - runs[False][top]).abs().max() < 0.05


def test_off_by_environment_or_switch(monkeypatch):
    monkeypatch.setenv("WAVEPP_NO_CPP_KERNELS", "1")
    assert (
        cpu_kernels._build("cpu_elementwise.cpp", "C++ elementwise kernels", "torch's ops") is None
    )
    assert (
        TORCH.fused(torch.zeros(4, dtype=torch.bfloat16)) is None
        and TORCH.elementwise_in_use() == "torch"
    )
    monkeypatch.setenv("WAVEPP_ELEMENTWISE_KERNEL", "torch")
    assert Kernels().elementwise == "torch"
