"""Kernel paths: timed at start-up unless pinned by the environment (the timed attention
choice: test_cascade_attention.py)."""

import pytest
import torch

from wavepp.models import attention, kernels


@pytest.fixture
def restore():
    yield
    kernels.use_linear("linear")
    attention.use_attention("chunked")


def test_linear_choice_is_timed_without_a_pin(monkeypatch, restore):
    monkeypatch.delenv("WAVEPP_LINEAR_KERNEL", raising=False)
    choice = kernels.choose_linear([(64, 128, 256), (256, 128, 128)], torch.bfloat16, trials=3)
    assert set(choice.gflops) == set(kernels.LINEAR_KERNELS)
    assert all(rate > 0 for rate in choice.gflops.values())
    assert choice.name == max(choice.gflops, key=choice.gflops.get) == kernels.linear_kernel()


def test_pinned_linear_and_attention_skip_the_timing(monkeypatch, restore):
    for name in kernels.LINEAR_KERNELS:
        monkeypatch.setenv("WAVEPP_LINEAR_KERNEL", name)
        choice = kernels.choose_linear([(64, 128, 256)], torch.bfloat16)
        assert choice.name == name == kernels.linear_kernel() and choice.gflops == {}
    for name in attention.ATTENTION_KERNELS:
        monkeypatch.setenv("WAVEPP_ATTENTION_KERNEL", name)
        choice = attention.choose_attention(2, 2, 16, torch.float32)
        assert choice.name == name == attention.attention_kernel() and choice.seconds == {}
    monkeypatch.setenv("WAVEPP_LINEAR_KERNEL", "nonsense")
    with pytest.raises(ValueError, match="unknown linear kernel"):
        kernels.choose_linear([(64, 128, 256)], torch.bfloat16)
    monkeypatch.setenv("WAVEPP_ATTENTION_KERNEL", "nonsense")
    with pytest.raises(ValueError, match="unknown attention kernel"):
        attention.choose_attention(2, 2, 16, torch.float32)
