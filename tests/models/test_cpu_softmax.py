"""The C++ softmax (models/kernels/cpp.py) against torch.softmax, and attention with it
against attention without it.

Tolerances: fp32 probabilities within 2e-6 relative of torch.softmax's where they are above
1e-6 of the row's largest (the kernel's exp is within 1e-6 of exp there, and both sum the row
in fp32 in another order), 6e-6 relative below (its exp loses 4e-8 |log2 x| relative) and
1e-37 absolute at fp32's subnormals; bf16 within one bf16 ulp of torch's (both round an fp32
probability that differs in its last bits).
"""

import logging
import random

import pytest
import torch

from wavepp.models.batch import ChunkSpec, StageBatch
from wavepp.models.kernels import MIN_SHARED_PREFIX_TOKENS, paged_attention
from wavepp.models.kernels import choice as attention
from wavepp.models.kernels import cpp as cpu_kernels

BS = 16
LENGTHS = (1, 2, 7, 15, 16, 17, 33, 100, 1601)

needs_kernels = pytest.mark.skipif(
    cpu_kernels.softmax_kernels() is None, reason="the C++ softmax could not be built here"
)


def causal_bias(rows: int, length: int, causal_rows: int) -> torch.Tensor:
    """[rows, length] 0 / -inf: row r sees keys [0, length - n + r % n] (n = causal_rows)."""
    if not causal_rows:
        return torch.zeros(rows, length)
    last = length - causal_rows + torch.arange(rows) % causal_rows  # last key seen
    return torch.zeros(rows, length).masked_fill(
        torch.arange(length)[None] > last[:, None], float("-inf")
    )


def assert_probabilities_close(got: torch.Tensor, want: torch.Tensor) -> None:
    if got.dtype == torch.bfloat16:
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-30)
        return
    big = want >= 1e-6 * want.amax(-1, keepdim=True)
    torch.testing.assert_close(got[big], want[big], rtol=2e-6, atol=0)
    torch.testing.assert_close(got[~big], want[~big], rtol=6e-6, atol=1e-37)


def random_tile(gen, heads, rows, length, dtype, spread=4.0):
    return (torch.randn(heads, rows, length, generator=gen) * spread).to(dtype)


@needs_kernels
@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", LENGTHS)
def test_softmax_equals_torch(length, dtype, vectorized):
    gen = torch.Generator().manual_seed(length)
    for causal_rows in sorted({0, 1, min(length, 3), min(length, 40)}):
        rows = 2 * max(causal_rows, 1)
        scores = random_tile(gen, 3, rows, length, dtype)
        want = torch.softmax(scores.float() + causal_bias(rows, length, causal_rows), -1).to(dtype)
        got = scores.clone()
        cpu_kernels.softmax_(got, causal_rows, vectorized=vectorized)
        assert_probabilities_close(got, want)
        if causal_rows:  # the hidden keys are exactly 0
            assert (got[causal_bias(rows, length, causal_rows).expand_as(got) < 0] == 0).all()


@needs_kernels
@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_of_large_and_infinite_scores(dtype, vectorized):
    gen = torch.Generator().manual_seed(1)
    scores = random_tile(gen, 2, 5, 37, torch.float32, spread=30.0)
    scores[0, 0] += 1e4  # large values: only differences count
    scores[0, 1, ::3] = float("-inf")  # hidden keys given as -inf
    scores[0, 2, :36] = float("-inf")  # one key left
    scores[1, 0, 5] = 200.0  # the rest underflow to 0
    scores = scores.to(dtype)
    want = torch.softmax(scores, -1)
    got = scores.clone()
    cpu_kernels.softmax_(got, vectorized=vectorized)
    assert_probabilities_close(got, want)
    assert got[0, 2, 36] == 1 and (got[0, 1, ::3] == 0).all()


@needs_kernels
def test_a_row_without_a_finite_score_is_nan_as_in_torch():
    scores = torch.zeros(1, 2, 20)
    scores[0, 1] = float("-inf")
    for vectorized in (True, False):
        got = scores.clone()
        cpu_kernels.softmax_(got, vectorized=vectorized)
        assert torch.isnan(got[0, 1]).all() and torch.isnan(torch.softmax(scores, -1)[0, 1]).all()
        assert torch.allclose(got[0, 0], torch.full((20,), 0.05))


@needs_kernels
@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "length,causal_rows", [(1, 0), (1, 1), (17, 0), (17, 5), (100, 16), (1601, 40)]
)
def test_unnormalized_softmax_gives_max_and_sum(length, causal_rows, dtype, vectorized):
    gen = torch.Generator().manual_seed(length + causal_rows)
    heads, rows = 3, 2 * max(causal_rows, 1)
    scores = random_tile(gen, heads, rows, length, dtype)
    masked = scores.float() + causal_bias(rows, length, causal_rows)
    want_max = masked.amax(-1)
    # row_max, row_sum: strided views, as the cascade kernel passes a tile's columns
    stats = torch.full((2, heads, rows + 4), float("nan"))
    row_max, row_sum = stats[0, :, 2 : rows + 2], stats[1, :, 2 : rows + 2]
    got = scores.clone()
    cpu_kernels.softmax_unnormalized_(got, causal_rows, row_max, row_sum, vectorized=vectorized)
    assert torch.equal(row_max, want_max)
    assert torch.isnan(stats[:, :, :2]).all() and torch.isnan(stats[:, :, rows + 2 :]).all()
    assert_probabilities_close(got, (masked - want_max[..., None]).exp().to(dtype))
    # the sum is of the values stored (rounded to bf16 in bf16), in fp32
    torch.testing.assert_close(row_sum, got.float().sum(-1), rtol=2e-6, atol=0)


@needs_kernels
def test_softmax_rejects_what_it_cannot_run():
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        cpu_kernels.softmax_(torch.zeros(2, 8, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="contiguous"):
        cpu_kernels.softmax_(torch.zeros(8, 2).t())
    with pytest.raises(RuntimeError, match="causal_rows"):
        cpu_kernels.softmax_(torch.zeros(3, 8), 2)


def shared_wave(rng, dtype):
    """A wave mixing chunks on one shared prefix (cascade groups them), on another shared
    prefix, and unshared ones; chunks of 1 to 70 tokens, on a shuffled pool."""
    blocks = list(range(400))
    rng.shuffle(blocks)
    prefix_a, prefix_b = tuple(blocks[:8]), tuple(blocks[8:13])  # 128 and 80 tokens
    free = iter(blocks[13:])
    chunks = []
    for index, (shared, cached, new) in enumerate(
        [
            (prefix_a, 128, 1),
            (prefix_a, 128, 64),
            (prefix_a, 150, 17),
            (prefix_a, 128, 70),
            (prefix_b, 80, 33),
            (prefix_b, 96, 1),
            ((), 0, 40),
            ((), 37, 1),
            ((), 300, 9),
        ]
    ):
        own = -(-(cached + new) // BS) - len(shared)
        chunks.append(ChunkSpec(cached, new, shared + tuple(next(free) for _ in range(own)), index))
    batch = StageBatch.build(chunks, BS)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    key_cache = torch.randn(400 * BS, 2, 32, generator=gen).to(dtype)
    value_cache = torch.randn(400 * BS, 2, 32, generator=gen).to(dtype)
    query = torch.randn(batch.num_tokens, 6, 32, generator=gen).to(dtype)
    return batch, query, key_cache, value_cache


@needs_kernels
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("kernel", ["chunked", "cascade"])
def test_attention_with_the_kernel_equals_attention_without(kernel, dtype, tolerance):
    rng = random.Random(7)
    for _ in range(3):
        batch, query, key_cache, value_cache = shared_wave(rng, dtype)
        assert len(batch.shared_prefixes(MIN_SHARED_PREFIX_TOKENS)) == 2
        want = paged_attention(query, key_cache, value_cache, batch, 32**-0.5, kernel=kernel)
        got = paged_attention(
            query, key_cache, value_cache, batch, 32**-0.5, kernel=kernel + "_cpp"
        )
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tolerance)


@pytest.fixture
def no_kernels(monkeypatch):
    """The extension as on a machine where it could not be built."""
    monkeypatch.setitem(cpu_kernels._modules, "cpu_softmax.cpp", None)


def test_without_the_extension_the_cpp_kernels_run_torch_softmax(no_kernels):
    batch, query, key_cache, value_cache = shared_wave(random.Random(3), torch.float32)
    assert cpu_kernels.softmax_kernels() is None
    for kernel in ("chunked", "cascade"):
        want = paged_attention(query, key_cache, value_cache, batch, 32**-0.5, kernel=kernel)
        got = paged_attention(
            query, key_cache, value_cache, batch, 32**-0.5, kernel=kernel + "_cpp"
        )
        assert torch.equal(got, want)


def test_without_the_extension_the_choice_times_the_others(no_kernels, monkeypatch):
    monkeypatch.delenv("WAVEPP_ATTENTION_KERNEL", raising=False)  # the suite pins it (conftest)
    assert attention.cpu_attention_kernels(torch.float32) == ("chunked", "cascade", "sdpa")
    choice = attention.choose_attention(2, 2, 16, torch.float32, trials=1)
    assert set(choice.seconds) == {"chunked", "cascade", "sdpa"}


def test_a_failed_build_logs_one_line_and_returns_none(monkeypatch, caplog):
    import torch.utils.cpp_extension

    def fail(*args, **kwargs):
        raise RuntimeError("Error building extension 'x'\nno compiler")

    monkeypatch.setattr(torch.utils.cpp_extension, "load_inline", fail)
    with caplog.at_level(logging.INFO, logger="wavepp.models.kernels.cpp"):
        assert cpu_kernels._build("cpu_softmax.cpp", "C++ softmax", "torch's softmax") is None
    assert len(caplog.records) == 1 and "no compiler" in caplog.records[0].getMessage()
    monkeypatch.setenv("WAVEPP_NO_CPP_KERNELS", "1")
    assert cpu_kernels._build("cpu_softmax.cpp", "C++ softmax", "torch's softmax") is None


def test_other_dtypes_and_devices_keep_torch_softmax():
    batch, query, key_cache, value_cache = shared_wave(random.Random(5), torch.float16)
    want = paged_attention(query, key_cache, value_cache, batch, 32**-0.5, kernel="chunked")
    got = paged_attention(query, key_cache, value_cache, batch, 32**-0.5, kernel="chunked_cpp")
    assert torch.equal(got, want)
    assert "chunked_cpp" not in attention.cpu_attention_kernels(torch.float16)


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path, monkeypatch, caplog):
    """torch's builder waits forever on a lock file its killed predecessor left: one older than
    STALE_LOCK_S is removed (and logged), a recent one (a build under way) is left alone."""
    import os
    import time

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    from torch.utils.cpp_extension import _get_build_directory

    lock = os.path.join(_get_build_directory("wavepp_test_ext", False), "lock")
    open(lock, "w").close()
    assert not cpu_kernels.clear_stale_lock("wavepp_test_ext") and os.path.exists(lock)
    old = time.time() - cpu_kernels.STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    with caplog.at_level(logging.WARNING):
        assert cpu_kernels.clear_stale_lock("wavepp_test_ext")
    assert not os.path.exists(lock) and "did not finish" in caplog.text
    assert not cpu_kernels.clear_stale_lock("wavepp_test_ext")  # nothing left to remove
