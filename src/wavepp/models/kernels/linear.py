"""Kernel paths chosen by measuring them on this machine, for the model's own shapes.

CPUs differ: on a Xeon with AMX, `torch.matmul(x, w.t())` reaches the AMX bf16 kernels and
runs 2-3x faster than `F.linear(x, w)`; on an AMD EPYC without AMX the two are alike, and which
is faster depends on the shape. So a stage times the candidates once at start-up on the
projections it will run, at the row counts its waves have, and uses the fastest:

    linear   F.linear(x, w)                 (x: [rows, in], w: [out, in])
    matmul   torch.matmul(x, w.t())
    packed   oneDNN with the weight reordered once into its blocked layout
             (`torch.ops.mkldnn._reorder_linear_weight`, `_linear_pointwise`): no per-call
             repacking, which on a CPU without AMX makes small waves (tens of rows) 20-45%
             faster; a CPU build with oneDNN, fp32 or bf16 (elsewhere F.linear runs instead);
             a view (an expert of stacked weights) runs as `matmul`, never reordered
    upcast   a bf16 (or fp16) projection in fp32: an fp32 copy of the weight kept beside it,
             x upcast, the product rounded back. On a CPU without bf16 arithmetic (AVX2 only:
             no AVX-512 BF16, no AMX) torch's bf16 GEMM falls back to a scalar loop: 10 GFLOP/s
             against fp32's 80 on an AVX2 EPYC core. The same numerics as a bf16 GEMM (which
             accumulates in fp32 too) up to summation order; twice the weight memory.

Every projection calls `Kernels.project(x, w, b)` (`kernels/choice.py`), which runs the path
the stage chose; `choose_linear(shapes, dtype)` measures them and returns the fastest;
`linear_shapes(model)` lists a stage model's projections. Nothing here holds a choice.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from wavepp import env


def _f_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, w, b)


def _matmul_t(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.matmul(x, w.t())
    return out if b is None else out.add_(b)


def _packed(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    # the reordered weight lives on the weight itself, with the version it was made from: an
    # in-place update of the weight (loading a checkpoint into it) packs it again. A view (an
    # expert of a stacked weight) is a new tensor at every call: packing it would reorder the
    # weight at every call (an MoE stage ran 40% slower so), so it runs as `matmul` does
    if w._base is not None:
        return _matmul_t(x, w, b)
    cached = getattr(w, "_wavepp_packed", None)
    if cached is None or cached[0] != w._version:
        cached = (w._version, _reorder(w))
        w._wavepp_packed = cached
    if cached[1] is None:  # this dtype or device has no oneDNN path
        return F.linear(x, w, b)
    return torch.ops.mkldnn._linear_pointwise(x, cached[1], b, "none", [], "")


def _upcast(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    if w.dtype == torch.float32 or x.dtype == torch.float32:
        return F.linear(x, w, b)
    if w._base is None:  # a parameter: its fp32 copy lives on it, made again after an update
        cached = getattr(w, "_wavepp_fp32", None)
        if cached is None or cached[0] != w._version:
            cached = (w._version, w.float())
            w._wavepp_fp32 = cached
        w32 = cached[1]
    else:  # a view (an expert of a stacked weight): upcast as it is used
        w32 = w.float()
    out = torch.matmul(x.float(), w32.t())
    if b is not None:
        out.add_(b.float())
    return out.to(x.dtype)


def _reorder(w: torch.Tensor) -> torch.Tensor | None:
    if (
        w.device.type != "cpu"
        or w.dtype not in (torch.float32, torch.bfloat16)
        or not packed_available()
    ):
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(w, None)
    except RuntimeError:  # e.g. bf16 on a CPU without the instructions oneDNN needs
        return None


def packed_available() -> bool:
    """This torch build has oneDNN's prepacked linear."""
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


LINEAR_KERNELS: dict[str, Callable] = {
    "linear": _f_linear,
    "matmul": _matmul_t,
    "packed": _packed,
    "upcast": _upcast,
}


def check_linear(name: str) -> str:
    if name not in LINEAR_KERNELS:
        raise ValueError(
            f"unknown linear kernel {name!r}; choose one of {', '.join(LINEAR_KERNELS)}"
        )
    return name


@dataclass(frozen=True)
class KernelChoice:
    name: str  # the fastest path (or the pinned one)
    gflops: dict[str, float]  # each candidate's rate over the shapes (median of trials)
    seconds: float  # the measurement's own time


def choose_linear(
    shapes: Sequence[tuple[int, int, int]],
    dtype: torch.dtype,
    *,
    trials: int = 5,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> KernelChoice:
    """Time every linear path on `shapes` ((rows, in, out) each) with random operands of `dtype`,
    the candidates interleaved trial by trial (so that a noisy neighbour hurts them alike), and
    return the one with the highest median rate. Takes well under a second for a model's shapes.
    `WAVEPP_LINEAR_KERNEL` (a name of LINEAR_KERNELS) skips the timing and returns that path:
    the same numerics in every process, run after run.

    On a CUDA `device` nothing is timed and F.linear is used: both paths are the same cuBLAS
    GEMM there (a transposed operand is a flag of the call, not a copy), so a timing would only
    measure noise, and a host clock around asynchronous kernels measures their launch."""
    pinned = env.linear_kernel_pin()
    if pinned:
        return KernelChoice(check_linear(pinned), {}, 0.0)
    if torch.device(device).type == "cuda":
        return KernelChoice("linear", {}, 0.0)
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    operands = [
        (torch.randn(r, i, generator=gen).to(dtype), torch.randn(o, i, generator=gen).to(dtype))
        for r, i, o in shapes
    ]
    flops = sum(2 * r * i * o for r, i, o in shapes)
    candidates = {
        name: fn
        for name, fn in LINEAR_KERNELS.items()
        if (name != "packed" or (packed_available() and _reorder(operands[0][1]) is not None))
        and (name != "upcast" or dtype != torch.float32)
    }
    rates: dict[str, list[float]] = {name: [] for name in candidates}
    for fn in candidates.values():  # warm up each path (first calls pick and pack)
        for x, w in operands:
            fn(x, w)
    for _ in range(trials):
        for name, fn in candidates.items():
            start = time.perf_counter()
            for x, w in operands:
                fn(x, w)
            rates[name].append(flops / (time.perf_counter() - start) / 1e9)
    gflops = {name: statistics.median(r) for name, r in rates.items()}
    return KernelChoice(max(gflops, key=gflops.get), gflops, time.perf_counter() - t0)


def linear_shapes(
    model: torch.nn.Module, rows: Sequence[int] = (64, 256, 512)
) -> list[tuple[int, int, int]]:
    """(rows, in, out) of every projection of a stage model: its 2-D weights [out, in] (3-D
    expert weights [experts, out, in] count once), the embedding and the head left out (the
    head runs on a few rows a wave)."""
    pairs = set()
    for name, p in model.named_parameters():
        if "embed" in name or "lm_head" in name or p.dim() not in (2, 3):
            continue
        out_features, in_features = p.shape[-2:]
        pairs.add((int(in_features), int(out_features)))
    return [(r, i, o) for r in rows for i, o in sorted(pairs)]
