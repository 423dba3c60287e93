"""Each layer's attention, timed alone, on the K/V the model itself computed.

    .venv/bin/python benchmarks/attention_layers.py [--model smollm2] [--kernel amx] [--runs 10]

Computes a 1,536-token prefix of random token ids through the whole model (so every layer's
cache holds that layer's real keys and values), then runs a wave of 4 chunks of 64 tokens
sharing the prefix `--runs` times, timing every call of the attention kernel. Prints the
median per layer and the sums over the first and second half of the layers (PP = 2's stages):
whether some layers' attention costs more than others' on the same wave, which bench_model's
random K/V cannot show (the AMX kernel redoes a row whose scores rise late, so its time
depends on the values).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import wavepp.models.kernels.choice as choice_module
from wavepp.models import ChunkSpec, StageBatch, load_stage_model
from wavepp.models.kernels import Kernels
from wavepp.model_store import resolve_model

BLOCK_SIZE = 16
PREFIX, CHUNKS, CHUNK = 1536, 4, 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="built-in name or HF directory")
    parser.add_argument("--kernel", default="amx", help="attention kernel (WAVEPP_ATTENTION_KERNEL's names)")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_stage_model(resolve_model(args.model), dtype=torch.bfloat16)
    vocab = model.config.vocab_size
    kernels = Kernels("packed", args.kernel)
    cache = model.new_kv_cache(num_blocks=PREFIX // BLOCK_SIZE + CHUNKS * CHUNK // BLOCK_SIZE + 1,
                               block_size=BLOCK_SIZE)
    rng = np.random.default_rng(0)
    prefix = torch.tensor(rng.integers(1, vocab, size=PREFIX))
    for start in range(0, PREFIX, 256):
        chunk = ChunkSpec(start, 256, tuple(range((start + 256) // BLOCK_SIZE)), 0)
        model(StageBatch.build([chunk], BLOCK_SIZE), cache, input_ids=prefix[start:start + 256], kernels=kernels)
    shared, own = tuple(range(PREFIX // BLOCK_SIZE)), CHUNK // BLOCK_SIZE
    specs = [ChunkSpec(PREFIX, CHUNK, shared + tuple(range(len(shared) + i * own, len(shared) + (i + 1) * own)), i)
             for i in range(CHUNKS)]
    wave = StageBatch.build(specs, BLOCK_SIZE)
    ids = torch.tensor(rng.integers(1, vocab, size=CHUNKS * CHUNK))

    calls: list[float] = []
    kernel = choice_module.paged_attention   # what Kernels.attend calls

    def timed(*a, **k):
        start = time.perf_counter()
        out = kernel(*a, **k)
        calls.append(time.perf_counter() - start)
        return out

    runs = []
    choice_module.paged_attention = timed
    try:
        for _ in range(args.runs + 1):   # the first is a warm-up
            calls.clear()
            model(wave, cache, input_ids=ids, kernels=kernels)
            runs.append(list(calls))
    finally:
        choice_module.paged_attention = kernel
    per_layer = [statistics.median(run[layer] for run in runs[1:]) * 1e3 for layer in range(len(runs[0]))]
    half = len(per_layer) // 2
    print(f"{args.kernel}: {CHUNKS} x {CHUNK} after a shared {PREFIX:,}, medians of {args.runs} (ms per layer):")
    print(" ".join(f"{ms:.2f}" for ms in per_layer))
    print(f"layers 0-{half - 1}: {sum(per_layer[:half]):.2f} ms, layers {half}-{len(per_layer) - 1}: "
          f"{sum(per_layer[half:]):.2f} ms")


if __name__ == "__main__":
    main()
