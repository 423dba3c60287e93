"""The routed experts of an MoE layer over rows already sorted by expert: two kernels.

The layer (`layers/moe.py`) routes, sorts the (token, expert) pairs by expert and gathers their
rows; each kernel then runs every active expert's SwiGLU over its own rows:

    routed  [num_pairs, hidden]     rows of expert 0 | rows of expert 1 | ... (some empty)
    gate_up [experts, 2 * I, hidden],  down [experts, hidden, I]  ->  [num_pairs, hidden]

    sorted   one gate/up and one down matmul per active expert, in a Python loop; the loop's
             bounds are the experts' row counts, read back to the host once per layer (on a GPU
             a device-to-host copy that waits for the router). The CPU's kernel, and the CUDA
             path's where `grouped` does not apply.
    grouped  torch's grouped GEMM (`F.grouped_mm`) over all experts at once, each expert's rows
             delimited by end offsets computed on the device: no loop, no read-back, two
             kernels a layer. On CUDA it needs bf16, compute capability 8.0 or later and
             row widths of whole 16 bytes (hidden and I multiples of 8); torch's CPU build runs
             it as a loop of matmuls (fp32 or bf16), which is how the tests check it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

EXPERT_KERNELS = ("sorted", "grouped")


def check_experts(kernel: str) -> str:
    if kernel not in EXPERT_KERNELS:
        raise ValueError(
            f"unknown experts kernel {kernel!r}; choose one of {', '.join(EXPERT_KERNELS)}"
        )
    return kernel


def grouped_applies(
    hidden_size: int, intermediate_size: int, dtype: torch.dtype, device: torch.device
) -> bool:
    """Whether the grouped GEMM runs these experts on `device` the way its CUDA kernel takes
    them: bf16, widths of whole 16 bytes and, on CUDA, compute capability 8.0 or later (the
    meta device, which checks the operands as CUDA does, counts as one)."""
    aligned = hidden_size % 8 == 0 and intermediate_size % 8 == 0
    if not (hasattr(F, "grouped_mm") and dtype == torch.bfloat16 and aligned):
        return False
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return True


def run_experts(
    kernel: str,
    routed: torch.Tensor,
    sorted_experts: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    project: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Each row of `routed` [num_pairs, hidden] through the SwiGLU of its expert,
    `sorted_experts` [num_pairs] (non-decreasing). `project`: the stage's projection path
    (`sorted` runs it; `grouped` is one GEMM of its own). Returns [num_pairs, hidden]."""
    check_experts(kernel)
    if kernel == "grouped":
        return _grouped(routed, sorted_experts, gate_up, down)
    return _sorted(routed, sorted_experts, gate_up, down, project)


def _sorted(routed, sorted_experts, gate_up, down, project) -> torch.Tensor:
    num_experts, intermediate = gate_up.shape[0], down.shape[-1]
    counts = torch.bincount(sorted_experts, minlength=num_experts).tolist()
    out = torch.empty_like(routed)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = slice(start, start + count)
        gate, up = project(routed[rows], gate_up[expert]).split(intermediate, -1)
        torch.mm(F.silu(gate).mul_(up), down[expert].t(), out=out[rows])
        start += count
    return out


def _grouped(routed, sorted_experts, gate_up, down) -> torch.Tensor:
    num_experts, intermediate = gate_up.shape[0], down.shape[-1]
    # ends[e]: one past expert e's last row (its rows [ends[e - 1], ends[e])), on the device
    experts = torch.arange(num_experts, device=routed.device, dtype=sorted_experts.dtype)
    ends = torch.searchsorted(sorted_experts, experts, right=True).to(torch.int32)
    # weights as [experts, in, out] views (column-major, as the kernel takes them)
    gate, up = F.grouped_mm(routed, gate_up.transpose(1, 2), offs=ends).split(intermediate, -1)
    # act: [num_pairs, I] -> [num_pairs, hidden]
    return F.grouped_mm(F.silu(gate).mul_(up), down.transpose(1, 2), offs=ends)
