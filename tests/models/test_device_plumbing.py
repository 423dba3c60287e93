"""The model code follows its device: on the CPU, without a GPU.

Two checks run here what cannot run a CUDA kernel:
- a stage model, its cache and its batch on the `meta` device run a forward through every
  attention kernel, and every family through the CUDA path's kernels (`cuda_kernels`), every
  op watched: an op that takes or makes a tensor anywhere but on the model's device (an index,
  a mask, a buffer made on the host) fails the test, as it would fail or copy on a GPU (meta
  kernels alone let some such mixes through; and the meta device checks the grouped GEMM's
  operands as its CUDA kernel does: bf16, widths of whole 16 bytes);
- the varlen kernel's operands (packed contexts, cumulative lengths) fed to an attention
  written from torch.nn.attention.varlen's documented contract equal the reference attention
  of test_attention_kernels.py in fp32. tests/gpu/ runs the real kernel on CUDA.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tests.models.test_attention_kernels import WAVES, random_wave, reference
from wavepp.models import ChunkSpec, StageBatch, StageModel, load_model_config, stage_specs
from wavepp.models.kernels import (
    ATTENTION_KERNELS,
    CUDA_ATTENTION_KERNELS,
    Kernels,
    cuda_kernels,
    paged_attention,
    varlen_operands,
)
from wavepp.random_checkpoint import HYBRID_ARCHS, MOE_ARCHS

META = torch.device("meta")


def test_batch_to_a_device_moves_every_tensor_and_later_masks_follow():
    chunks = [ChunkSpec(8, 5, (3, 1, 0, 7)), ChunkSpec(0, 3, (2,))]
    batch = StageBatch.build(chunks, 4)
    assert batch.to(torch.device("cpu")) is batch and batch.to("cpu") is batch  # no copy on the CPU
    assert batch.cu_tokens.tolist() == list(batch.token_starts) == [0, 5, 8]
    assert batch.cu_context.tolist() == list(batch.context_starts) == [0, 13, 16]
    assert batch.cu_tokens.dtype == batch.cu_context.dtype == torch.int32
    assert batch.max_chunk_tokens == 5
    moved = batch.to(META)
    tensors = [
        moved.positions,
        moved.slot_mapping,
        moved.context_slots,
        moved.last_token_indices,
        moved.causal_mask,
        moved.cu_tokens,
        moved.cu_context,
    ]
    assert all(t.device == META for t in tensors) and moved.device == META
    assert moved.causal_bias(torch.float32).device == META and moved.visible_mask(0).device == META
    assert batch.causal_bias(torch.float32).device.type == "cpu"  # the host batch keeps its own
    assert (moved.chunks, moved.token_starts, moved.max_position) == (
        batch.chunks,
        batch.token_starts,
        12,
    )


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS + CUDA_ATTENTION_KERNELS)
@pytest.mark.parametrize("stage_id", [1, 2])  # a middle stage, the last (logits)
def test_stage_forward_on_meta_makes_nothing_on_the_host(tiny_models, kernel, stage_id):
    config = load_model_config(tiny_models["qwen3"])
    spec = stage_specs(config.num_layers, 3)[stage_id]
    model = StageModel(config, spec, torch.bfloat16).to(META)
    assert model.device == META
    kv = model.new_kv_cache(num_blocks=16, block_size=4)
    assert kv.device == META
    # two chunks after one shared 8-token prefix (cascade groups them), one cold chunk
    chunks = [ChunkSpec(8, 3, (0, 1, 2)), ChunkSpec(8, 4, (0, 1, 3)), ChunkSpec(0, 6, (4, 5))]
    batch = StageBatch.build(chunks, 4).to(META)
    hidden = torch.empty(batch.num_tokens, config.hidden_size, dtype=torch.bfloat16, device=META)
    # varlen: meta passes its CPU guard, the call is torch's fake
    with OffDevice(META) as watch:
        out = model(batch, kv, hidden_states=hidden, kernels=Kernels(attention=kernel))
    assert watch.ops == []
    width = config.vocab_size if spec.is_last else config.hidden_size
    rows = batch.num_chunks if spec.is_last else batch.num_tokens
    assert out.device == META and out.shape == (rows, width)


@pytest.mark.parametrize("arch", [*MOE_ARCHS, *HYBRID_ARCHS])
def test_every_family_on_meta_through_the_cuda_path_makes_nothing_on_the_host(
    moe_models, hybrid_models, arch
):
    """Each family's middle and last stage of three (4 layers: [0, 2), [2, 3), [3, 4)) in bf16
    through `cuda_kernels`' choice, GQA by SDPA and by varlen: MoE by the grouped GEMM, MLA
    absorbed, DSA's indexer keeping 4 keys and a shared layer's selection from the stage
    before, KDA's scan from a snapshot and into one."""
    path = {**moe_models, **hybrid_models}["glm_moe_dsa/topk4" if arch == "glm_moe_dsa" else arch]
    config = load_model_config(path)
    kernels = cuda_kernels(config, torch.bfloat16, META)
    assert (kernels.mla, kernels.moe, kernels.elementwise) == ("absorbed", "grouped", "torch")
    gqa = any(layer.attention.kind == "gqa" for layer in config.layers)
    # chunks after one shared 8-token prefix (its state in slot 0), one cold chunk
    chunks = [
        ChunkSpec(8, 3, (0, 1, 2), state_in=0, state_saves=((11, 1),)),
        ChunkSpec(8, 4, (0, 1, 3), state_in=0),
        ChunkSpec(0, 6, (4, 5), state_saves=((4, 2), (6, 3))),
    ]
    if not config.is_hybrid:
        chunks = [dataclasses.replace(c, state_in=None, state_saves=()) for c in chunks]
    batch = StageBatch.build(chunks, 4).to(META)
    for spec in stage_specs(config.num_layers, 3)[1:]:
        model = StageModel(config, spec, torch.bfloat16).to(META)
        kv = model.new_kv_cache(num_blocks=16, block_size=4)
        hidden = torch.empty(batch.num_tokens, model.input_width, dtype=torch.bfloat16, device=META)
        for attention in ("sdpa", "varlen") if gqa else ("sdpa",):
            with OffDevice(META) as watch:
                out = model(
                    batch,
                    kv,
                    hidden_states=hidden,
                    kernels=dataclasses.replace(kernels, attention=attention),
                )
            assert watch.ops == [], (spec, attention)
            rows, width = (
                (batch.num_chunks, config.vocab_size)
                if spec.is_last
                else (batch.num_tokens, model.output_width)
            )
            assert out.device == META and out.shape == (rows, width)


class OffDevice(TorchDispatchMode):
    """Records every op that takes or returns a tensor off `device` (0-d scalars aside)."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device, self.ops = device, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        if any(t.device != self.device and t.dim() > 0 for t in tensors):
            self.ops.append(str(func))
        return out


def test_a_batch_on_another_device_than_the_weights_is_refused(tiny_models):
    config = load_model_config(tiny_models["llama"])
    model = StageModel(config, stage_specs(config.num_layers, 2)[1], torch.float32).to(META)
    kv = model.new_kv_cache(num_blocks=4, block_size=4)
    batch = StageBatch.build([ChunkSpec(0, 3, (0,))], 4)  # left on the host
    hidden = torch.empty(3, config.hidden_size, device=META)
    with pytest.raises(ValueError, match="the batch is on cpu, this stage's weights on meta"):
        model(batch, kv, hidden_states=hidden)


def test_varlen_kernel_is_refused_on_the_cpu():
    rng = random.Random(0)
    batch, query, key_cache, value_cache = random_wave(
        rng, WAVES["mixed lengths"], 2, 2, 16, torch.float32
    )
    with pytest.raises(ValueError, match="runs on CUDA only"):
        paged_attention(query, key_cache, value_cache, batch, 0.25, kernel="varlen")


@pytest.mark.parametrize("wave", WAVES)
@pytest.mark.parametrize(
    "heads", [(3, 3, 64), (2, 1, 16), (1, 4, 32)]
)  # (kv_heads, group, head_dim)
def test_varlen_operands_give_the_reference_attention(wave, heads):
    kv_heads, group, head_dim = heads
    rng = random.Random(f"varlen{wave}{heads}")
    batch, query, key_cache, value_cache = random_wave(
        rng, WAVES[wave], kv_heads, group, head_dim, torch.float32
    )
    scale = head_dim**-0.5
    args, kwargs = varlen_operands(query, key_cache, value_cache, batch, scale)
    assert kwargs == {"scale": scale, "window_size": (-1, 0), "enable_gqa": True}
    out = documented_varlen(*args, **kwargs).reshape(batch.num_tokens, -1)
    torch.testing.assert_close(
        out.double(), reference(query, key_cache, value_cache, batch, scale), rtol=0, atol=2e-6
    )


def documented_varlen(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale, window_size, enable_gqa
):
    """torch.nn.attention.varlen.varlen_attn as documented: sequence i's queries are rows
    cu_seq_q[i]:cu_seq_q[i+1], its keys cu_seq_k[i]:cu_seq_k[i+1]; window (-1, 0) is causal,
    aligned to the bottom right (FlashAttention's convention when a sequence has more keys than
    queries: query r of n sees keys [0, r + (k - n)]); GQA by head groups."""
    assert window_size == (-1, 0) and enable_gqa
    assert cu_seq_q.dtype == cu_seq_k.dtype == torch.int32
    q_starts, k_starts = cu_seq_q.tolist(), cu_seq_k.tolist()
    assert max_q == max(b - a for a, b in zip(q_starts, q_starts[1:]))
    assert max_k == max(b - a for a, b in zip(k_starts, k_starts[1:]))
    heads, kv_heads = query.shape[1], key.shape[1]
    out = torch.empty_like(query)
    for i in range(len(q_starts) - 1):
        q = query[q_starts[i] : q_starts[i + 1]].double()  # [n, heads, d]
        k = key[k_starts[i] : k_starts[i + 1]].double().repeat_interleave(heads // kv_heads, 1)
        v = value[k_starts[i] : k_starts[i + 1]].double().repeat_interleave(heads // kv_heads, 1)
        n, length = q.shape[0], k.shape[0]
        scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
        hidden = torch.arange(length)[None, :] > torch.arange(n)[:, None] + (length - n)
        probs = scores.masked_fill(hidden, float("-inf")).softmax(-1)
        out[q_starts[i] : q_starts[i + 1]] = torch.einsum("hnl,lhd->nhd", probs, v).to(out.dtype)
    return out
