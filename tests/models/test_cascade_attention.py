"""Cascade (shared-prefix) attention equals chunk-by-chunk attention.

Chunks that read the same cached blocks attend to them in one matmul and merge with their own
part by log-sum-exp; the result must equal attending chunk by chunk. fp32, tolerance 2e-6: the
two orders sum the same terms differently (exp of shifted scores, then a weighted merge).
"""

import random

import pytest
import torch

from wavepp.models.batch import ChunkSpec, StageBatch
from wavepp.models.kernels import MIN_SHARED_PREFIX_TOKENS, cpp, paged_attention

BS = 16
KV_HEADS, GROUP, HEAD_DIM = 2, 3, 16


def make_wave(rng, specs):
    """specs: (shared prefix id or None, prefix blocks, own cached tokens, new tokens) per chunk.
    Chunks with the same prefix id get the same leading block ids."""
    next_block, prefixes, chunks = 0, {}, []
    for index, (pid, prefix_blocks, own_cached, num_new) in enumerate(specs):
        if pid is not None and pid not in prefixes:
            prefixes[pid] = list(range(next_block, next_block + prefix_blocks))
            next_block += prefix_blocks
        table = list(prefixes[pid]) if pid is not None else []
        cached = len(table) * BS + own_cached
        need = -(-(cached + num_new) // BS) - len(table)
        # own cached tokens start on a fresh block after the shared ones (whole blocks only)
        table += list(range(next_block, next_block + need))
        next_block += need
        chunks.append(ChunkSpec(cached, num_new, tuple(table), index))
    order = list(range(len(chunks)))
    rng.shuffle(order)  # members need not be adjacent
    return StageBatch.build([chunks[i] for i in order], BS), next_block


@pytest.mark.parametrize("seed", range(6))
def test_cascade_equals_chunk_by_chunk(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    specs = [
        ("a", 6, 0, 64),
        ("a", 6, 0, 1),
        ("a", 6, 32, 17),
        ("a", 6, 16, 40),  # a shared 96-token prefix
        ("b", 5, 0, 33),
        ("b", 5, 0, 1),  # another one
        ("c", 8, 0, 20),  # alone: no group
        (None, 0, 0, 50),
        (None, 0, 48, 1),  # nothing shared
    ]
    rng.shuffle(specs)
    batch, num_blocks = make_wave(rng, specs)
    groups = batch.shared_prefixes(MIN_SHARED_PREFIX_TOKENS)
    assert sorted(len(m) for m, _ in groups) == [2, 4] and sorted(p for _, p in groups) == [80, 96]
    key_cache = torch.randn(num_blocks * BS, KV_HEADS, HEAD_DIM)
    value_cache = torch.randn(num_blocks * BS, KV_HEADS, HEAD_DIM)
    query = torch.randn(batch.num_tokens, KV_HEADS * GROUP, HEAD_DIM)
    cascade = paged_attention(
        query, key_cache, value_cache, batch, HEAD_DIM**-0.5, kernel="cascade"
    )
    plain = paged_attention(query, key_cache, value_cache, batch, HEAD_DIM**-0.5, kernel="chunked")
    torch.testing.assert_close(cascade, plain, rtol=0, atol=2e-6)
    # and both equal a dense reference per chunk (float64)
    for i, chunk in enumerate(batch.chunks):
        t0, t1 = batch.token_starts[i], batch.token_starts[i + 1]
        ctx = batch.context_slots[batch.context_starts[i] : batch.context_starts[i + 1]]
        k, v = key_cache[ctx].double(), value_cache[ctx].double()
        q = query[t0:t1].double().view(t1 - t0, KV_HEADS, GROUP, HEAD_DIM)
        scores = torch.einsum("nkgd,lkd->nkgl", q, k) * HEAD_DIM**-0.5
        pos = torch.arange(chunk.num_cached_tokens, chunk.end)
        scores[
            (torch.arange(chunk.end)[None, :] > pos[:, None])[:, None, None, :].expand_as(scores)
        ] = float("-inf")
        ref = torch.einsum("nkgl,lkd->nkgd", scores.softmax(-1), v).reshape(t1 - t0, -1)
        torch.testing.assert_close(cascade[t0:t1].double(), ref, rtol=0, atol=2e-6)


def test_short_or_partly_cached_prefixes_are_not_grouped():
    # two chunks share one block (below the minimum), and a chunk whose shared block is not
    # yet cached for it (it computes that block now) shares nothing
    a = ChunkSpec(16, 8, (0, 1), "a")
    b = ChunkSpec(16, 8, (0, 2), "b")
    assert StageBatch.build([a, b], BS).shared_prefixes(MIN_SHARED_PREFIX_TOKENS) == []
    assert StageBatch.build([a, b], BS).shared_prefixes(16) == [((0, 1), 16)]
    c = ChunkSpec(64, 1, tuple(range(10, 15)), "c")
    d = ChunkSpec(0, 65, tuple(range(20, 25)), "d")
    assert StageBatch.build([c, d], BS).shared_prefixes(16) == []


def test_the_choice_is_measured(monkeypatch):
    """The choice is measured here; that a stage then runs it: tests/runtime/test_stage_kernels.py."""
    from wavepp.models.kernels import ATTENTION_KERNELS, choose_attention

    monkeypatch.delenv("WAVEPP_ATTENTION_KERNEL", raising=False)  # the suite pins it (conftest)
    choice = choose_attention(KV_HEADS, GROUP, HEAD_DIM, torch.float32, trials=1)
    # every CPU kernel but the bf16-only AMX one (and the C++ softmax ones where it was not built)
    assert set(choice.seconds) == set(ATTENTION_KERNELS) - {"amx"} - (
        set() if cpp.softmax_kernels() is not None else {"chunked_cpp", "cascade_cpp"}
    )
    assert all(t > 0 for t in choice.seconds.values()) and all(
        g > 0 for g in choice.gflops.values()
    )
    fastest = min(choice.seconds, key=choice.seconds.get)
    # another kernel replaces the default only when it is 5% faster
    expected = fastest if choice.seconds["chunked"] >= 1.05 * choice.seconds[fastest] else "chunked"
    assert choice.name == expected


def test_amx_is_timed_in_bf16_where_it_runs(monkeypatch):
    from wavepp.models.kernels import choose_attention

    monkeypatch.delenv("WAVEPP_ATTENTION_KERNEL", raising=False)
    choice = choose_attention(KV_HEADS, GROUP, HEAD_DIM, torch.bfloat16, trials=1)
    assert ("amx" in choice.seconds) == (cpp.amx_attention_kernels() is not None)
