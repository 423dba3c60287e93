"""Kernel paths: every candidate computes the same projection; the choice is measured and used."""

import pytest
import torch

from wavepp.models import kernels
from wavepp.models.kernels import LINEAR_KERNELS, choose_linear, linear, linear_kernel, linear_shapes, use_linear


@pytest.fixture(autouse=True)
def restore_kernel():
    before = linear_kernel()
    yield
    use_linear(before)


@pytest.mark.parametrize("name", list(LINEAR_KERNELS))
@pytest.mark.parametrize("bias", [False, True])
def test_every_path_equals_the_reference(name, bias):
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(37, 48, generator=gen), torch.randn(20, 48, generator=gen)
    b = torch.randn(20, generator=gen) if bias else None
    use_linear(name)
    ref = x.double() @ w.double().t() + (b.double() if bias else 0)
    out = linear(x, w, b)
    assert out.shape == (37, 20) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)    # fp32 summation order


def test_choice_is_the_fastest_measured_and_is_used(monkeypatch):
    monkeypatch.delenv("WAVEPP_LINEAR_KERNEL", raising=False)   # the suite pins it (conftest.py)
    calls = []
    slow = LINEAR_KERNELS["linear"]

    def slowed(x, w, b=None):       # a path that is clearly slower than the other
        calls.append(1)
        for _ in range(20):
            out = slow(x, w, b)
        return out

    monkeypatch.setitem(kernels.LINEAR_KERNELS, "linear", slowed)
    choice = choose_linear([(64, 32, 48), (8, 48, 32)], torch.float32, trials=3)
    assert choice.name == "matmul" == linear_kernel()
    assert choice.gflops["matmul"] > choice.gflops["linear"] > 0 and calls
    with pytest.raises(ValueError, match="unknown linear kernel 'amx'"):
        use_linear("amx")


def test_linear_shapes_are_a_stage_models_projections(tiny_models):
    from wavepp.models import load_model_config, load_stage_model, stage_specs

    path = tiny_models["llama"]
    config = load_model_config(path)
    model = load_stage_model(path, stage_specs(config.num_layers, 1)[0], torch.float32)
    shapes = linear_shapes(model, rows=(8,))
    h, kv, inter = config.hidden_size, config.num_kv_heads * config.head_dim, config.intermediate_size
    assert sorted(shapes) == sorted({(8, h, config.num_heads * config.head_dim + 2 * kv),
                                     (8, config.num_heads * config.head_dim, h), (8, h, 2 * inter), (8, inter, h)})
