"""Kernel paths: timed at start-up unless pinned by the environment (the timed choices:
test_kernels.py, test_cascade_attention.py)."""

import pytest
import torch

from wavepp.models.kernels import ATTENTION_KERNELS, LINEAR_KERNELS, choose_attention, choose_linear


def test_pinned_linear_and_attention_skip_the_timing(monkeypatch):
    for name in LINEAR_KERNELS:
        monkeypatch.setenv("WAVEPP_LINEAR_KERNEL", name)
        choice = choose_linear([(64, 128, 256)], torch.bfloat16)
        assert choice.name == name and choice.gflops == {}
    for name in ATTENTION_KERNELS:
        monkeypatch.setenv("WAVEPP_ATTENTION_KERNEL", name)
        choice = choose_attention(2, 2, 16, torch.float32)
        assert choice.name == name and choice.seconds == {}
    monkeypatch.setenv("WAVEPP_LINEAR_KERNEL", "nonsense")
    with pytest.raises(ValueError, match="unknown linear kernel"):
        choose_linear([(64, 128, 256)], torch.bfloat16)
    monkeypatch.setenv("WAVEPP_ATTENTION_KERNEL", "nonsense")
    with pytest.raises(ValueError, match="unknown attention kernel"):
        choose_attention(2, 2, 16, torch.float32)
