"""Kernel paths: timed at start-up unless pinned by the environment (the timed choices:
test_kernels.py, test_cascade_attention.py)."""

import pytest
import torch

from wavepp.models import attention, kernels


@pytest.fixture
def restore():
    yield
    kernels.use_linear("linear")
    attention.use_attention("chunked")


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
