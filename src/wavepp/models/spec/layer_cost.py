"""The cost model of a model's layers, from their kinds: FLOPs of the reference chunks.

Where the layers' times are not measured (runtime/layer_timing.py), the layer split is balanced
on this (`LayerCosts` with unit "flop"). Each kind declares its own count (`chunk_flops` of the
attention kinds in spec/attention.py, `flops_per_token` of the MLP kinds in spec/mlp.py):

    layer i  = attention.chunk_flops(L, x)  +  x * mlp.flops_per_token     (GQA | MLA[+DSA] | KDA,
                                                                            dense | MoE's active)
    first    = 0: the embedding is a gather
    last     = 2 * hidden * vocab per chunk: the LM head runs on each chunk's last token only

summed over the reference chunks (`REFERENCE_CHUNKS`: 512 new tokens after none and after 512
cached, a prefix-reuse workload's two sides). FLOPs are not seconds: on the CPU small layers
run slower than their FLOPs say (per-op overheads, an MoE's loop over experts), which is why
the runtime measures where it can. Pure Python.
"""

from __future__ import annotations

from typing import Sequence

from wavepp.models.spec.layer_split import LayerCosts
from wavepp.models.spec.model import ModelSpec

Chunk = tuple[int, int]  # (num_cached_tokens, num_tokens)
REFERENCE_CHUNKS: tuple[Chunk, ...] = ((0, 512), (512, 512))


def reference_chunks(max_positions: int, block_size: int = 1) -> tuple[Chunk, ...]:
    """`REFERENCE_CHUNKS` fitted to a model of `max_positions` positions: the new tokens halved
    (and kept whole blocks) until a chunk after as many cached tokens fits."""
    new = REFERENCE_CHUNKS[-1][1]
    while new > block_size and 2 * new > max_positions:
        new //= 2
    new = max(1, new // block_size * block_size)
    return ((0, new), (new, new))


def modeled_costs(spec: ModelSpec, chunks: Sequence[Chunk] = REFERENCE_CHUNKS) -> LayerCosts:
    """Each layer's FLOPs over `chunks` (one request chunk each), the embedding's (none) and the
    LM head's (one row per chunk)."""
    hidden = spec.hidden_size
    layers = tuple(
        sum(
            layer.attention.chunk_flops(cached, new, hidden)
            + new * layer.mlp.flops_per_token(hidden)
            for cached, new in chunks
        )
        for layer in spec.layers
    )
    return LayerCosts(
        layers, 0.0, 2.0 * hidden * spec.vocab_size * len(chunks), unit="flop", source="cost model"
    )
