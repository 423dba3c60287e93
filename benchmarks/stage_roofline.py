"""One stage's forward against the device's measured bf16 matmul rate, on any device.

    .venv/bin/python benchmarks/stage_roofline.py --model DIR [--device cuda] [--pp 2 --stage 1]
        [--waves 4x64@1536,1x256@1536,1x512@0] [--runs 5] [--matmul-size 8192] [--json FILE]

Loads stage `--stage` of the model split into `--pp` stages (default: the whole model as one
stage) on `--device` in bf16, with the kernels a stage chooses there (`choose_kernels`: on
CUDA the CUDA path, nothing timed), fills its cache with random rows, and times its forward
over each wave (chunks of N new tokens after P cached, `NxN@P`; each chunk in blocks of its
own; a hybrid model's chunks after a prefix start from snapshot slot 0), the device's queue
drained around each run: median of `--runs` after a warm-up.

The roofline is the best of a few size^3 bf16 matmuls (`--matmul-size`: 8192 on CUDA, 1024
on the CPU). A wave's FLOPs are the cost model's (spec/layer_cost.py: each layer kind's
`chunk_flops` and the MLP's active FLOPs per token, the LM head on the last stage; MLA
counted in its MHA form, as the CPU runs it, so a stage in absorbed form may show more or
less than the FLOPs it does). Prints one row per wave and writes them with the machine and the
kernels to `--json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from wavepp.bench.report import cpu_name
from wavepp.models import load_model_config, load_stage_model, stage_specs
from wavepp.models.kernels import choose_kernels
from wavepp.runtime.device import synchronize
from wavepp.runtime.profile import time_wave

BLOCK_SIZE = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an HF-format directory")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--pp", type=int, default=1, help="stages the model is split into")
    parser.add_argument("--stage", type=int, default=0, help="the stage timed")
    parser.add_argument("--waves", default="4x64@1536,1x256@1536,1x512@0",
                        help="comma list of NUMxTOKENS@CACHED waves")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--matmul-size", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    report = run(args.model, device, args.pp, args.stage, parse_waves(args.waves), args.runs,
                 args.matmul_size or (8192 if device.type == "cuda" else 1024))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")


def parse_waves(text: str) -> list[tuple[int, int, int]]:
    """"4x64@1536,1x512@0" -> [(4, 64, 1536), (1, 512, 0)]: (chunks, new tokens, cached)."""
    waves = []
    for item in text.split(","):
        shape, _, cached = item.strip().partition("@")
        num, _, tokens = shape.partition("x")
        waves.append((int(num), int(tokens), int(cached or 0)))
    return waves


def run(model_path: str, device: torch.device, pp: int, stage_id: int,
        waves: list[tuple[int, int, int]], runs: int, matmul_size: int) -> dict:
    config = load_model_config(model_path)
    spec = stage_specs(config.num_layers, pp)[stage_id]
    model = load_stage_model(model_path, spec, torch.bfloat16).to(device)
    kernels = choose_kernels(model, config, torch.bfloat16, device).kernels
    blocks = max(num * -(-(tokens + cached) // BLOCK_SIZE) for num, tokens, cached in waves)
    kv = model.new_kv_cache(blocks, BLOCK_SIZE)
    for tensor in kv.tensors.values():
        tensor.normal_()
    roofline = matmul_tflops(device, matmul_size)
    name = _device_name(device)
    print(f"model {model_path}: stage {stage_id} of {pp} (layers {spec.start_layer}-"
          f"{spec.end_layer - 1} of {config.num_layers}), bf16 on {name}, torch {torch.__version__}")
    print(f"kernels: {kernels}")
    print(f"roofline: {roofline:.1f} TFLOP/s, the best {matmul_size}^3 bf16 matmul")
    print(f"\n{'wave':>16} {'ms':>9} {'tokens/s':>10} {'TFLOP/s':>8} {'roof':>6}")
    rows = []
    gen = torch.Generator().manual_seed(0)
    for num, tokens, cached in waves:
        chunks = [(cached, tokens)] * num
        time_wave(model, kv, chunks, BLOCK_SIZE, gen, kernels)  # warm-up
        seconds = statistics.median(
            time_wave(model, kv, chunks, BLOCK_SIZE, gen, kernels) for _ in range(max(1, runs))
        )
        tflops = wave_flops(config, spec, chunks) / seconds / 1e12
        row = {"wave": f"{num}x{tokens}@{cached}", "ms": seconds * 1e3,
               "tokens_per_s": num * tokens / seconds, "tflops": tflops,
               "roofline_share": tflops / roofline}
        rows.append(row)
        print(f"{row['wave']:>16} {row['ms']:9.2f} {row['tokens_per_s']:10.0f} {tflops:8.2f} "
              f"{tflops / roofline:6.1%}", flush=True)
    return {"model": str(model_path), "device": name, "device_type": device.type,
            "torch": torch.__version__, "pp": pp, "stage": stage_id,
            "layers": [spec.start_layer, spec.end_layer], "kernels": str(kernels),
            "matmul_size": matmul_size, "roofline_tflops": roofline, "waves": rows}


def wave_flops(config, spec, chunks: list[tuple[int, int]]) -> float:
    """The cost model's FLOPs of the stage's layers over `chunks` ((cached, new) each), and
    its LM head's (one row a chunk) on the last stage."""
    hidden = config.hidden_size
    flops = sum(
        config.layer(i).attention.chunk_flops(cached, new, hidden)
        + new * config.layer(i).mlp.flops_per_token(hidden)
        for i in range(spec.start_layer, spec.end_layer)
        for cached, new in chunks
    )
    return flops + (2.0 * hidden * config.vocab_size * len(chunks) if spec.is_last else 0.0)


def matmul_tflops(device: torch.device, size: int, runs: int = 10) -> float:
    """The fastest of `runs` size^3 bf16 matmuls on `device`, as TFLOP/s."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    a @ b  # warm-up: the library picks its kernel
    times = []
    for _ in range(runs):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times) / 1e12


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


if __name__ == "__main__":
    main()
