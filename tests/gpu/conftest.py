"""The CUDA tests' fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def cuda_kernel_choice(monkeypatch):
    """The suite pins the CPU kernels (tests/conftest.py); on CUDA the stages choose their own."""
    monkeypatch.delenv("WAVEPP_ATTENTION_KERNEL", raising=False)
    monkeypatch.delenv("WAVEPP_LINEAR_KERNEL", raising=False)


def assert_near_cpu(cpu, gpu) -> None:
    """bf16 results on CUDA near the CPU engine's: each first token's logprob within 0.1, and
    the same first token wherever the CPU's top two are over 0.1 apart (bf16 may swap
    near-ties only), which at least half the prompts are."""
    checked = 0
    for c, g in zip(cpu, gpu):
        assert c.ok and g.ok, (c.error, g.error)
        assert abs(c.first_token_logprob - g.first_token_logprob) < 0.1
        (_, lp0), (_, lp1) = c.top_logprobs[:2]
        if lp0 - lp1 > 0.1:
            assert g.first_token_id == c.first_token_id
            checked += 1
    assert checked >= len(cpu) // 2
