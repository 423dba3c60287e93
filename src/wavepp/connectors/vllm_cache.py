"""What the WavePPConnector writes into vLLM's paged cache, and reads from the directory store:
a load's rows (model layer -> pool -> [tokens, width], tokens [start, end) of the prompt) go
into each attention layer's cache through that layer's own `do_kv_cache_update`, so the cache
takes the layout of the backend that runs (on the CPU: K and V rows per block, repacked for AMX
or the vector ISA). An MLA layer takes one `latent` row [c | k_rope] per token through the MLA
backend's `do_kv_cache_update(kv_c_normed, k_pe, ...)`.

Imports vLLM, torch and safetensors (it runs in vLLM's environment)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file
from vllm.model_executor.layers.attention.mla_attention import MLAAttention

if TYPE_CHECKING:
    from wavepp.connectors.vllm import LoadSpec
    from wavepp.kv_transfer.directory.store import DirectoryStore

Rows = dict[int, dict[str, torch.Tensor]]  # model layer -> pool -> [tokens, width]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def write_rows(forward_context, load: LoadSpec, rows: Rows, rope_interleave: bool) -> None:
    """`rows` (tokens [load.start, load.end) of the prompt) into the request's blocks of each
    attention layer's cache. `rope_interleave`: an MLA model whose cache keeps k_rope in
    DeepSeek's interleaved order (load_latents)."""
    positions = torch.arange(load.start, load.end)
    blocks = torch.tensor(load.block_ids, dtype=torch.int64)
    slots = blocks[positions // load.block_size] * load.block_size + positions % load.block_size
    for name, layer in forward_context.no_compile_layers.items():
        cache = getattr(layer, "kv_cache", None)
        match = _LAYER.search(name)
        if cache is None or not cache.numel() or match is None or int(match.group(1)) not in rows:
            continue
        pools = rows[int(match.group(1))]
        if isinstance(layer, MLAAttention):
            load_latents(layer, pools["latent"], cache, slots, rope_interleave)
            continue
        key, value = pools["key"], pools["value"]
        num_kv_heads = layer.num_kv_heads
        # [tokens, kv_heads * head_dim] -> [tokens, kv_heads, head_dim], the cache's dtype
        key = key.view(-1, num_kv_heads, key.shape[-1] // num_kv_heads)
        value = value.view(-1, num_kv_heads, value.shape[-1] // num_kv_heads)
        dtype = cache.dtype if cache.is_floating_point() else key.dtype
        layer.impl.do_kv_cache_update(
            layer,
            key.to(cache.device, dtype),
            value.to(cache.device, dtype),
            cache,
            slots.to(cache.device),
        )


def load_latents(
    layer: MLAAttention,
    latent: torch.Tensor,
    cache: torch.Tensor,
    slots: torch.Tensor,
    rope_interleave: bool,
) -> None:
    """latent: [tokens, kv_lora_rank + rope] rows [c | k_rope] -> the layer's cache at `slots`.
    wavepp (like transformers) rotates DeepSeek's RoPE pairs (2i, 2i+1) as the de-interleaved
    vector and exports k_rope as (x[0::2] | x[1::2]); vLLM's DeepSeek MLA rotates in place, so
    with `rope_interleave` its cache holds the interleaved order."""
    rank = layer.kv_lora_rank
    latent = latent.to(cache.device, cache.dtype)
    kv_c_normed = latent[:, :rank].contiguous()  # [tokens, kv_lora_rank]
    k_pe = latent[:, rank:]  # [tokens, rope]
    if rope_interleave:
        # (x[0::2] | x[1::2]) -> x: [tokens, 2, rope / 2] -> [tokens, rope / 2, 2] -> [tokens, rope]
        k_pe = k_pe.unflatten(-1, (2, -1)).transpose(-1, -2).flatten(-2)
    k_pe = k_pe.contiguous()[:, None]  # [tokens, 1, rope], as the layer passes it
    layer.impl.do_kv_cache_update(
        kv_c_normed, k_pe, cache, slots.to(cache.device), layer.kv_cache_dtype, layer._k_scale
    )


def read_store_rows(store: DirectoryStore, load: LoadSpec) -> Rows:
    """Tokens [load.start, load.end) of every part of the transfer in the store: `key` and
    `value` [tokens, kv_heads * head_dim], or MLA's `latent` [tokens, kv_lora_rank + rope]."""
    out: Rows = {}
    for part in store.read(load.transfer_id, verify=False).parts:
        tensors = load_file(str(part.path))
        for pool, held in part.manifest["pools"].items():
            for j, layer in enumerate(held["layers"]):
                out.setdefault(layer, {})[pool] = tensors[pool][j, load.start : load.end]
    return out
