"""Single-stage prefill speed of the stage model: computed tokens/s after a cached prefix.

    .venv/bin/python benchmarks/bench_model.py [--threads 1] [--runs 5] [--model smollm2]
    .venv/bin/python benchmarks/bench_model.py --families [--dtype bfloat16]
    .venv/bin/python benchmarks/bench_model.py --softmax-ab [--runs 7]

Runs the whole model as one stage in bf16 over chunks of 128/256/512 tokens after cached
prefixes of 0/1k/4k tokens, and over batches of several chunks (waves batch requests),
including the short-suffix waves of prefix reuse (4 chunks of 64, or one of 256, after 1,536
cached tokens). The cached prefix is filled with random K/V: attention cost does not depend
on the values. Each case is warmed up, then timed `--runs` times; the table shows medians.
Model: the built-in SmolLM2-135M when available, else a random model of the same shape.

Columns: the whole forward's GFLOP/s (projections and attention counted: q.k and p.v over
the visible keys) and its share of the roofline, the best bf16 matmul rate measured on this
core (a 1024^3 matmul or the projection kernels on the model's shapes, whichever is higher);
then one layer's attention alone on the same chunks (the chosen kernel, timed by itself),
its GFLOP/s and share of the roofline. The last line is the check: after a 1.5k prefix, the
whole forward at >= 60% of the roofline and one layer's attention alone at >= 40%.

`--softmax-ab` instead runs the checked waves with torch's softmax and with the C++ one
(`chunked` against `chunked_cpp`, `cascade` against `cascade_cpp`), alternating run by run,
and prints the ratios of the medians: the whole forward, one layer's attention, and the
softmax alone on that wave's score tiles.

`--families` instead times each MoE / latent-attention family's tiny config (`wavepp
make-model --arch minimax_m2 | deepseek_v3 | glm_moe_dsa`, 4 layers, hidden 64, 8 experts
top-2): computed tokens/s per chunk shape, with the cache pools filled with random rows.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from wavepp.bench.report import cpu_name
from wavepp.models import ChunkSpec, StageBatch, load_model_config, load_stage_model
from wavepp.models.kernels import Kernels, attention_flops, choose_attention, choose_linear, linear_shapes, paged_attention
from wavepp.models.kernels import cpp as cpu_kernels

CHUNKS = (128, 256, 512)
PREFIXES = (0, 1024, 4096)
BATCHES = ((4, 128, 0), (4, 128, 1024), (8, 64, 1024), (2, 256, 1024))  # (chunks, tokens, prefix)
CHECKED = ((4, 64, 1536), (1, 256, 1536))   # short-suffix waves after a 1.5k prefix: the check
BLOCK_SIZE = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="built-in name or HF directory")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--families", action="store_true",
                        help="time the tiny MiniMax-M2, DeepSeek-V3 and GLM-5 configs instead")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                        help="with --families")
    parser.add_argument("--softmax-ab", action="store_true",
                        help="torch's softmax against the C++ one on the checked waves, interleaved")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.families:
        _bench_families(getattr(torch, args.dtype), args.runs)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path, label = _model_path(args.model, tmp)
        config = load_model_config(path)
        model = load_stage_model(path, dtype=torch.bfloat16)
    print(f"model: {label}  ({config.num_layers} layers, hidden {config.hidden_size}, "
          f"{config.num_heads}/{config.num_kv_heads} heads)  dtype bf16")
    print(f"machine: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    max_tokens = max(PREFIXES) + max(CHUNKS) + max(n * (t + p) for n, t, p in BATCHES)
    cache = model.new_kv_cache(num_blocks=max_tokens // BLOCK_SIZE + 16, block_size=BLOCK_SIZE)
    for tensor in cache.tensors.values():
        tensor.normal_()
    flops_per_token = _matmul_flops_per_token(config)
    matmul, matmul_fp32 = _matmul_gflops(torch.bfloat16), _matmul_gflops(torch.float32)
    choice = choose_linear(linear_shapes(model), torch.bfloat16)
    rates = ", ".join(f"{name} {rate:.0f}" for name, rate in choice.gflops.items())
    print(f"projection kernel: {choice.name} (measured on this model's shapes, GFLOP/s: {rates}; "
          f"{choice.seconds:.2f} s)")
    attn = choose_attention(config.num_kv_heads, config.num_heads // config.num_kv_heads, config.head_dim,
                            torch.bfloat16)
    rates = ", ".join(f"{name} {rate:.0f}" for name, rate in attn.gflops.items())
    print(f"attention kernel: {attn.name} (4 chunks of 64 after a shared 1,024, GFLOP/s: {rates})")
    built = cpu_kernels.softmax_kernels() is not None
    print(f"C++ softmax: {'in use' if attn.name.endswith('_cpp') else 'built, not chosen' if built else 'unavailable'}"
          f" ({'chunked_cpp, cascade_cpp' if built else 'torch.softmax only'})")
    kernels = Kernels(choice.name, attn.name)
    print(f"elementwise (RMSNorm, SiLU-and-mul, RoPE): {kernels.elementwise_in_use()}")
    if args.softmax_ab:
        _softmax_ab(model, cache, config, args.runs, kernels)
        return
    # the core's matrix rate for a bf16 model: its bf16 GEMM, or fp32 where bf16 arithmetic is
    # slow and the projections run upcast (an AVX2-only CPU), whichever is faster
    roofline = max(matmul, matmul_fp32, max(choice.gflops.values()))
    print(f"roofline: {roofline:.0f} GFLOP/s, the best matmul measured on this core (1024^3 bf16: "
          f"{matmul:.0f}, fp32: {matmul_fp32:.0f}; the projection paths above); the layer stack's "
          f"{flops_per_token / 1e6:.0f} MFLOP/token caps prefill at {roofline * 1e9 / flops_per_token:.0f} "
          f"tokens/s before any attention")
    print(f"\n{'case':>22} {'ms':>9} {'tokens/s':>9} {'GFLOP/s':>8} {'roof':>5} {'cpu/wall':>8}"
          f" {'attn GF/s':>9} {'roof':>5}")
    for prefix in PREFIXES:
        for chunk in CHUNKS:
            _case(model, cache, config, [(prefix, chunk)], flops_per_token, args.runs, roofline, kernels)
    for num_chunks, chunk, prefix in BATCHES:
        _case(model, cache, config, [(prefix, chunk)] * num_chunks, flops_per_token, args.runs, roofline, kernels)
    checked = [_case(model, cache, config, [(prefix, chunk)] * num_chunks, flops_per_token, args.runs, roofline,
                     kernels) for num_chunks, chunk, prefix in CHECKED]
    worst, worst_attention = min(c[0] for c in checked), min(c[1] for c in checked)
    print(f"\nafter a 1.5k prefix the whole forward runs at {worst / roofline:.0%} of the roofline "
          f"(lowest of {len(CHECKED)} waves; {'meets' if worst >= 0.6 * roofline else 'below'} the 60% check), "
          f"attention alone at {worst_attention / roofline:.0%} "
          f"({'meets' if worst_attention >= 0.4 * roofline else 'below'} the 40% check)")


FAMILY_CASES = ((0, 128), (0, 512), (1024, 128), (1024, 512), (4096, 256))   # (prefix, chunk)


def _bench_families(dtype: torch.dtype, runs: int) -> None:
    from wavepp.random_checkpoint import MOE_ARCHS, make_model

    print(f"machine: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), {dtype}")
    print(f"\n{'family':>12} {'case':>16} {'ms':>9} {'tokens/s':>9} {'cpu/wall':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for arch in MOE_ARCHS:
            path = make_model(f"{tmp}/{arch}", arch=arch, max_position_embeddings=8192)
            model = load_stage_model(path, dtype=dtype)
            max_tokens = max(p + n for p, n in FAMILY_CASES)
            cache = model.new_kv_cache(num_blocks=max_tokens // BLOCK_SIZE + 1, block_size=BLOCK_SIZE)
            for tensor in cache.tensors.values():
                tensor.normal_()
            for prefix, chunk in FAMILY_CASES:
                table = tuple(range(-(-(prefix + chunk) // BLOCK_SIZE)))
                batch = StageBatch.build([ChunkSpec(prefix, chunk, table, 0)], BLOCK_SIZE)
                input_ids = torch.randint(0, model.config.vocab_size, (chunk,))
                seconds, busy = _time(lambda: model(batch, cache, input_ids=input_ids), runs)
                print(f"{arch:>12} {f'{chunk} after {prefix}':>16} {seconds * 1e3:9.1f} "
                      f"{chunk / seconds:9.0f} {busy:8.0%}", flush=True)


def _time(fn, runs: int) -> tuple[float, float]:
    """Median wall seconds of `runs` calls after a warm-up, and cpu/wall per thread."""
    fn()
    times, cpu_times = [], []
    for _ in range(runs):
        start, cpu_start = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    seconds = statistics.median(times)
    return seconds, statistics.median(cpu_times) / seconds / torch.get_num_threads()


def _layer0_kv(cache, config):
    """Layer 0's key and value pools as [num_slots, kv_heads, head_dim] views."""
    heads = (-1, config.num_kv_heads, config.head_dim)
    return cache.view("key", 0).view(heads), cache.view("value", 0).view(heads)


def _softmax_ab(model, cache, config, runs: int, chosen: Kernels) -> None:
    """Torch's softmax (A) against the C++ one (B), alternating run by run on the checked waves:
    the ratio of medians A / B (above 1: B faster)."""
    if cpu_kernels.softmax_kernels() is None:
        print("C++ softmax unavailable: nothing to compare")
        return
    print(f"\n{'case':>22} {'kernels':>24} {'forward':>8} {'attention':>9} {'softmax':>8}   (A / B, medians of {runs})")
    key_cache, value_cache = _layer0_kv(cache, config)
    for num_chunks, chunk, prefix in CHECKED:
        batch = _wave([(prefix, chunk)] * num_chunks)
        input_ids = torch.randint(0, config.vocab_size, (batch.num_tokens,))
        query = torch.randn(batch.num_tokens, config.num_heads, config.head_dim, dtype=torch.bfloat16)
        tiles = _score_tiles(config, [(prefix, chunk)] * num_chunks)
        for plain in ("chunked", "cascade"):
            kernels = (plain, plain + "_cpp")
            forward = _interleaved([lambda k=k: model(batch, cache, input_ids=input_ids,
                                                      kernels=Kernels(chosen.linear, k))
                                    for k in kernels], runs)
            attn = _interleaved([lambda k=k: paged_attention(query, key_cache, value_cache, batch,
                                                             config.head_dim ** -0.5, kernel=k)
                                 for k in kernels], 3 * runs)
            soft = _interleaved([lambda: [torch.softmax(t, -1) for t in tiles],
                                 lambda: [cpu_kernels.softmax_(t.clone(), 0) for t in tiles]], 3 * runs)
            print(f"{f'{num_chunks}x{chunk} after {prefix}':>22} {' / '.join(kernels):>24} "
                  f"{forward[0] / forward[1]:8.2f} {attn[0] / attn[1]:9.2f} {soft[0] / soft[1]:8.2f}", flush=True)


def _interleaved(fns, runs: int) -> list[float]:
    """Median seconds of each of `fns`, called in turn `runs` times after one warm-up round."""
    times = [[] for _ in fns]
    for trial in range(runs + 1):
        for fn, spent in zip(fns, times):
            start = time.perf_counter()
            fn()
            if trial:
                spent.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _score_tiles(config, chunks: list[tuple[int, int]]) -> list[torch.Tensor]:
    """One layer's score tiles of `chunks` as `chunked` makes them ([kv_heads, group * rows,
    seen], bf16, rows of at most 128 per tile); the C++ side is timed with a copy (clone)
    against torch's softmax, which allocates its output."""
    kv_heads, group = config.num_kv_heads, config.num_heads // config.num_kv_heads
    tiles = []
    for prefix, num_new in chunks:
        for a in range(0, num_new, 128):
            b = min(num_new, a + 128)
            tiles.append(torch.randn(kv_heads, group * (b - a), prefix + b).bfloat16())
    return tiles


def _case(model, cache, config, chunks: list[tuple[int, int]], flops_per_token: float, runs: int,
          roofline: float, kernels: Kernels) -> float:
    """Print one row; returns the whole forward's GFLOP/s and one layer's attention's."""
    batch = _wave(chunks)
    input_ids = torch.randint(0, config.vocab_size, (batch.num_tokens,))
    seconds, busy = _time(lambda: model(batch, cache, input_ids=input_ids, kernels=kernels), runs)
    # cpu/wall well below threads x 100% means another process took the core meanwhile
    layer_flops = attention_flops(config.num_heads, config.head_dim, chunks)
    flops = batch.num_tokens * flops_per_token + config.num_layers * layer_flops
    # one layer's attention alone, on the same chunks over layer 0's cache
    key_cache, value_cache = _layer0_kv(cache, config)
    query = torch.randn(batch.num_tokens, config.num_heads, config.head_dim, dtype=torch.bfloat16)
    attn_seconds, _ = _time(lambda: kernels.attend(query, key_cache, value_cache, batch, config.head_dim ** -0.5),
                            3 * runs)
    name = (f"{len(chunks)}x{chunks[0][1]} after {chunks[0][0]}" if len(chunks) > 1
            else f"{chunks[0][1]} after {chunks[0][0]}")
    gflops, attn_gflops = flops / seconds / 1e9, layer_flops / attn_seconds / 1e9
    print(f"{name:>22} {seconds * 1e3:9.1f} {batch.num_tokens / seconds:9.0f} {gflops:8.1f} "
          f"{gflops / roofline:5.0%} {busy:8.0%} {attn_gflops:9.1f} {attn_gflops / roofline:5.0%}", flush=True)
    return gflops, attn_gflops


def _wave(chunks: list[tuple[int, int]]) -> StageBatch:
    """A wave of (prefix, num_tokens) chunks over the bench's cache blocks."""
    specs, next_block = [], 0
    if len({prefix for prefix, _ in chunks}) == 1 and len(chunks) > 1:
        # chunks of one wave after the same prefix share its blocks, as prefix reuse has them
        shared = chunks[0][0] // BLOCK_SIZE
        next_block = shared
        for index, (prefix, num_tokens) in enumerate(chunks):
            own = -(-(prefix + num_tokens) // BLOCK_SIZE) - shared
            specs.append(ChunkSpec(prefix, num_tokens, tuple(range(shared)) + tuple(range(next_block, next_block + own)), index))
            next_block += own
    else:
        for index, (prefix, num_tokens) in enumerate(chunks):
            num_blocks = -(-(prefix + num_tokens) // BLOCK_SIZE)
            specs.append(ChunkSpec(prefix, num_tokens, tuple(range(next_block, next_block + num_blocks)), index))
            next_block += num_blocks
    return StageBatch.build(specs, BLOCK_SIZE)


def _matmul_flops_per_token(config) -> float:
    per_layer = config.hidden_size * (2 * config.q_size + 2 * config.kv_size + 3 * config.intermediate_size)
    return 2.0 * config.num_layers * per_layer


def _matmul_gflops(dtype: torch.dtype, size: int = 1024, runs: int = 20) -> float:
    """The fastest of `runs` size^3 matmuls in `dtype`, as GFLOP/s (3 runs where one takes over
    0.2 s: a bf16 GEMM that falls back to a scalar loop, 1-3 GFLOP/s on an AVX2-only core)."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    start = time.perf_counter()
    a @ b
    times = [time.perf_counter() - start]
    for _ in range(runs if times[0] < 0.2 else 3):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size ** 3 / min(times) / 1e9


def _model_path(name: str, tmp: str):
    try:
        from wavepp.model_store import resolve_model
        return resolve_model(name), name
    except Exception as err:  # built-in model unavailable: a random model of the same shape
        from wavepp.random_checkpoint import make_model
        print(f"({name} unavailable: {err}; using a random model of SmolLM2-135M's shape)")
        path = make_model(f"{tmp}/random", arch="llama", num_layers=30, hidden_size=576, num_heads=9,
                          num_kv_heads=3, intermediate_size=1536, vocab_size=49152,
                          tie_word_embeddings=True)
        return path, "random SmolLM2-135M-shaped"


if __name__ == "__main__":
    main()
