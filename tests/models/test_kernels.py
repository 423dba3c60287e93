"""Kernel paths: every candidate computes the same projection; the choice is measured (and a
stage runs it: tests/runtime/test_stage_kernels.py)."""

import pytest
import torch

from wavepp.models.kernels import LINEAR_KERNELS, Kernels, choose_linear, linear_shapes
from wavepp.models.kernels import linear as kernels


@pytest.mark.parametrize("name", list(LINEAR_KERNELS))
@pytest.mark.parametrize("bias", [False, True])
def test_every_path_equals_the_reference(name, bias):
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(37, 48, generator=gen), torch.randn(20, 48, generator=gen)
    b = torch.randn(20, generator=gen) if bias else None
    ref = x.double() @ w.double().t() + (b.double() if bias else 0)
    out = Kernels(linear=name).project(x, w, b)
    assert out.shape == (37, 20) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)  # fp32 summation order


def test_choice_is_the_fastest_measured(monkeypatch):
    monkeypatch.delenv("WAVEPP_LINEAR_KERNEL", raising=False)  # the suite pins it (conftest)
    calls = []
    slow = LINEAR_KERNELS["linear"]

    def slowed(x, w, b=None):  # a path that is clearly slower than the other
        calls.append(1)
        for _ in range(20):
            out = slow(x, w, b)
        return out

    def slowed_packed(x, w, b=None):
        for _ in range(20):
            out = kernels._packed(x, w, b)
        return out

    monkeypatch.setitem(kernels.LINEAR_KERNELS, "linear", slowed)
    monkeypatch.setitem(kernels.LINEAR_KERNELS, "packed", slowed_packed)
    choice = choose_linear([(64, 32, 48), (8, 48, 32)], torch.float32, trials=3)
    assert choice.name == "matmul"
    assert choice.gflops["matmul"] > choice.gflops["linear"] > 0 and calls
    if kernels.packed_available():
        assert choice.gflops["matmul"] > choice.gflops["packed"] > 0
    with pytest.raises(ValueError, match="unknown linear kernel 'amx'"):
        Kernels(linear="amx")


def test_linear_shapes_are_a_stage_models_projections(tiny_models):
    from wavepp.models import load_model_config, load_stage_model, stage_specs

    path = tiny_models["llama"]
    config = load_model_config(path)
    model = load_stage_model(path, stage_specs(config.num_layers, 1)[0], torch.float32)
    shapes = linear_shapes(model, rows=(8,))
    h, kv, inter = (
        config.hidden_size,
        config.num_kv_heads * config.head_dim,
        config.intermediate_size,
    )
    assert sorted(shapes) == sorted(
        {
            (8, h, config.num_heads * config.head_dim + 2 * kv),
            (8, config.num_heads * config.head_dim, h),
            (8, h, 2 * inter),
            (8, inter, h),
        }
    )


@pytest.mark.skipif(not kernels.packed_available(), reason="this torch build has no oneDNN")
def test_packed_weight_follows_in_place_updates_and_falls_back_where_unsupported():
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(16, 32, generator=gen), torch.randn(24, 32, generator=gen)
    linear = Kernels(linear="packed").project
    first = linear(x, w)
    torch.testing.assert_close(first, x @ w.t(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        w.mul_(2.0)  # loading new weights in place
    torch.testing.assert_close(linear(x, w), 2 * first, rtol=1e-5, atol=1e-5)
    # a dtype oneDNN's packed path does not take (float64) runs F.linear instead
    xd, wd = x.double(), w.double()
    torch.testing.assert_close(linear(xd, wd), xd @ wd.t())
    # bf16, the runtime's dtype: the packed path and F.linear agree within bf16 rounding
    xb, wb = x.bfloat16(), w.bfloat16()
    torch.testing.assert_close(
        linear(xb, wb).float(), torch.nn.functional.linear(xb, wb).float(), rtol=2e-2, atol=2e-2
    )


@pytest.mark.skipif(not kernels.packed_available(), reason="this torch build has no oneDNN")
def test_packed_never_reorders_a_view_of_a_stacked_weight(monkeypatch):
    """An expert's weight is a view of the stacked experts, a new tensor at every call: packing
    it would reorder the weight on every call (an MoE stage ran 40% slower so); a parameter is
    reordered once."""
    reorders = []
    real = kernels._reorder
    monkeypatch.setattr(kernels, "_reorder", lambda w: reorders.append(w.shape) or real(w))
    gen = torch.Generator().manual_seed(3)
    x, stacked = torch.randn(8, 32, generator=gen), torch.randn(4, 24, 32, generator=gen)
    linear = Kernels(linear="packed").project
    for _ in range(3):
        for e in range(4):
            torch.testing.assert_close(linear(x, stacked[e]), x @ stacked[e].t())
    assert reorders == []
    w = torch.randn(24, 32, generator=gen)
    for _ in range(3):
        linear(x, w)
    assert reorders == [w.shape]


def test_upcast_computes_bf16_projections_in_fp32_and_follows_weight_updates():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(16, 32, generator=gen).bfloat16()
    w = torch.randn(24, 32, generator=gen).bfloat16()
    b = torch.randn(24, generator=gen).bfloat16()
    upcast = Kernels(linear="upcast").project
    out = upcast(x, w, b)

    # the product of the bf16 operands in fp32, rounded once to bf16: within one bf16 step of
    # the exact product (the fp32 sum's order is the BLAS's)
    def close(got, exact):
        torch.testing.assert_close(got.float(), exact.bfloat16().float(), rtol=2**-8, atol=1e-6)

    assert out.dtype == torch.bfloat16
    close(out, x.double() @ w.double().t() + b.double())
    with torch.no_grad():
        w.mul_(2.0)  # loading new weights in place: a new fp32 copy
    close(upcast(x, w), x.double() @ w.double().t())
    # a view of a stacked weight (an expert) is upcast as it is used, not cached on the view
    stacked = torch.randn(3, 24, 32, generator=gen).bfloat16()
    close(upcast(x, stacked[1]), x.double() @ stacked[1].double().t())
    # fp32 operands: plain F.linear
    torch.testing.assert_close(upcast(x.float(), w.float()), x.float() @ w.float().t())


def test_upcast_is_timed_for_bf16_only(monkeypatch):
    monkeypatch.delenv("WAVEPP_LINEAR_KERNEL", raising=False)
    assert "upcast" in choose_linear([(8, 32, 16)], torch.bfloat16, trials=1).gflops
    assert "upcast" not in choose_linear([(8, 32, 16)], torch.float32, trials=1).gflops
