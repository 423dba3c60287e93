"""The layers' times, measured at start-up before the layers are split into stages (what
`layer_split="auto"` balances: runtime/stage_split.py, models/spec/layer_split.py).

Layers of one kind (an equal `LayerSpec`: the same attention and MLP) compute the same on the same
shapes, so one layer of each kind is timed and stands for all of them: it is loaded alone, a
one-layer slice read from the checkpoint (its own tensors only), on the device the stages use, and
run over the reference chunks (spec/layer_cost.py: 512 new tokens after none and after 512 cached,
fitted to the model's positions), each the fastest of `repeat` runs after one warm-up wave (other
work on the machine only ever adds time). The embedding and the final norm + LM head are timed on
their own (`StageModel.embed_tokens`, `logits`) and taken out of the slice that carries them. So the
pass loads one slice at a time, at most (kinds + 2) of them: about 0.2 s on the tiny test models.
The kernels are the defaults (`Kernels()`; on a GPU the CUDA path's, `cuda_kernels`), not the
stage's measured choice: what the split needs is the layers' ratios.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Sequence

import torch

from wavepp.models import StageSpec, load_stage_model
from wavepp.models.kernels import Kernels, cuda_kernels
from wavepp.models.spec import LayerCosts, ModelSpec
from wavepp.models.spec.layer_cost import Chunk, reference_chunks
from wavepp.runtime.device import synchronize
from wavepp.runtime.profile import time_wave


@dataclass(frozen=True)
class SliceTimes:
    """Seconds of one one-layer slice over the reference chunks: its layer, and the embedding
    or the head where the slice carries them (else 0)."""

    layer_s: float
    embed_s: float = 0.0
    head_s: float = 0.0


def measure_layer_costs(
    model_path: str,
    spec: ModelSpec,
    dtype: torch.dtype,
    device: str | torch.device,
    block_size: int,
    *,
    num_threads: int = 1,
    repeat: int = 2,
) -> LayerCosts:
    """Every layer's seconds over the reference chunks (its kind's, timed once), the
    embedding's and the head's, with `num_threads` compute threads (a stage's; the process's
    own are put back after)."""
    n = spec.num_layers
    chunks = reference_chunks(spec.max_position_embeddings, block_size)
    kinds = kind_representatives(spec)
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        timed = {
            i: time_slice(
                model_path, StageSpec(i, i + 1, n), dtype, device, chunks, block_size, repeat
            )
            for i in sorted({*kinds.values(), 0, n - 1})
        }
    finally:
        torch.set_num_threads(previous)
    per_kind = {kind: timed[i].layer_s for kind, i in kinds.items()}
    layers = tuple(per_kind[spec.layer(i)] for i in range(n))
    return LayerCosts(layers, timed[0].embed_s, timed[n - 1].head_s, unit="s")


def kind_representatives(spec: ModelSpec) -> dict:
    """LayerSpec -> the layer timed for it: its first layer that is neither the first nor the
    last of the model (whose slices also carry the embedding or the head), else its first."""
    kinds: dict = {}
    inner = [i for i in range(spec.num_layers) if 0 < i < spec.num_layers - 1]
    for i in [*inner, *range(spec.num_layers)]:
        kinds.setdefault(spec.layer(i), i)
    return kinds


@torch.inference_mode()
def time_slice(
    model_path: str,
    stage: StageSpec,
    dtype: torch.dtype,
    device: str | torch.device,
    chunks: Sequence[Chunk],
    block_size: int,
    repeat: int = 2,
) -> SliceTimes:
    """Load the slice `stage` on `device` and time it over `chunks` (one wave each): the whole
    forward, and on their own the embedding and the head it carries, taken out of the forward's
    time for the layer's (never below 0)."""
    model = load_stage_model(model_path, stage, dtype).to(device)
    longest = max(cached + new for cached, new in chunks)
    kv = model.new_kv_cache(-(-longest // block_size), block_size)
    gen = torch.Generator().manual_seed(0)
    kernels = (
        cuda_kernels(model.config, dtype, model.device)
        if model.device.type == "cuda"
        else Kernels()
    )
    time_wave(model, kv, chunks[:1], block_size, gen, kernels)  # warm-up: first-call costs
    forward_s = sum(
        min(time_wave(model, kv, ((c, x),), block_size, gen, kernels) for _ in range(repeat))
        for c, x in chunks
    )
    embed_s = head_s = 0.0
    width = model.config.hidden_size
    if stage.is_first:
        for _, x in chunks:
            ids = torch.randint(0, model.config.vocab_size, (x,), generator=gen).to(model.device)
            embed_s += _fastest(_timed(partial(model.embed_tokens, ids), model.device), repeat)
    if stage.is_last:  # one row a chunk: its last token's
        row = torch.randn(1, width, generator=gen).to(model.dtype).to(model.device)
        head_s = len(chunks) * _fastest(
            _timed(partial(model.logits, row, kernels), model.device), repeat
        )
    return SliceTimes(max(0.0, forward_s - embed_s - head_s), embed_s, head_s)


def _timed(fn, device: torch.device):
    """fn as a callable that returns its own seconds (the device's queue drained around it)."""

    def run() -> float:
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        return time.perf_counter() - t0

    return run


def _fastest(run, repeat: int) -> float:
    """The fastest of `repeat` calls of `run` (returning seconds), after an untimed one."""
    run()
    return min(run() for _ in range(max(1, repeat)))
