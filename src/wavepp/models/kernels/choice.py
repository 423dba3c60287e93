"""The kernel paths a stage runs: one object, chosen once per process, passed to every forward.

    Kernels(linear, attention, elementwise, mla, moe)
        linear       the projections' path (`kernels/linear.py`: linear | matmul | packed)
        attention    the GQA attention kernel (`kernels/attention.py`)
        elementwise  "cpp": the fused C++ SiLU-and-mul, RMSNorm and RoPE where they run (bf16,
                     CPU, contiguous; `kernels/cpp.py`), else torch's ops; "torch": torch's always
        mla          MLA's form (`layers/mla.py`): "expanded", each chunk's context expanded
                     into per-head keys and values; "absorbed", SDPA over the latent rows as
                     one KV head shared by every head (`kernels/attention_torch.py`)
        moe          the routed experts' kernel (`kernels/experts.py`): sorted | grouped

`choose_kernels` measures the linear paths and the attention kernels on the stage's own shapes
(CPUs differ: AMX, AVX-512, neither) the first time a stage of this process starts on a device
type and dtype; a stage started later in the same process (rank 0 of a second Engine, as
`wavepp bench` runs one for single-stage) takes the same paths instead of timing again, so
engines compared side by side in one process run the same kernels. A path pinned in the
environment (`wavepp/env.py`) always wins. The model holds no choice: `StageModel.forward`
takes the `Kernels` it runs with.

On a CUDA device nothing is timed: `cuda_kernels` gives the CUDA path, made of torch's own
GPU kernels only (no C++ extension of ours, no oneDNN, nothing CPU-only):

    attention  varlen FlashAttention (bf16 / fp16, compute capability >= 8.0), else SDPA
    mla        absorbed: SDPA over the latent cache, nothing expanded (DSA: its selection as
               SDPA's mask; the indexer and its top-k are torch ops)
    moe        grouped: torch's grouped GEMM (bf16, widths of whole 16 bytes), else sorted
    KDA        its chunked scan (`layers/kda_scan.py`) is torch ops on any device

`cuda_kernels` takes the device, so a test on the CPU (or the meta device) gets the same
choices, less what needs the GPU itself (varlen: SDPA stands in).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from wavepp import env
from wavepp.models.batch import ChunkSpec, StageBatch
from wavepp.models.kernels import cpp
from wavepp.models.kernels.attention import (
    ATTENTION_KERNELS,
    CUDA_ATTENTION_KERNELS,
    check_attention,
    paged_attention,
)
from wavepp.models.kernels.attention_torch import varlen_applies
from wavepp.models.kernels.experts import check_experts, grouped_applies, run_experts
from wavepp.models.kernels.linear import (
    LINEAR_KERNELS,
    KernelChoice,
    check_linear,
    choose_linear,
    linear_shapes,
)

MLA_FORMS = ("expanded", "absorbed")


@dataclass(frozen=True)
class Kernels:
    linear: str = "linear"
    attention: str = "chunked"
    elementwise: str = field(default_factory=env.elementwise_kernel)
    mla: str = "expanded"
    moe: str = "sorted"

    def __post_init__(self) -> None:
        check_linear(self.linear)
        check_attention(self.attention)
        check_experts(self.moe)
        if self.elementwise not in ("cpp", "torch"):
            raise ValueError(
                f"unknown elementwise kernel {self.elementwise!r}; choose cpp or torch"
            )
        if self.mla not in MLA_FORMS:
            raise ValueError(f"unknown MLA form {self.mla!r}; choose one of {', '.join(MLA_FORMS)}")

    def project(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x @ w.T (+ b) by this path. x: [..., in], w: [out, in] -> [..., out]."""
        return LINEAR_KERNELS[self.linear](x, w, b)

    def attend(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        batch: StageBatch,
        scale: float,
    ) -> torch.Tensor:
        """`paged_attention` by this kernel."""
        return paged_attention(query, key_cache, value_cache, batch, scale, kernel=self.attention)

    def experts(
        self,
        routed: torch.Tensor,
        sorted_experts: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
    ) -> torch.Tensor:
        """`run_experts` by this kernel: routed [num_pairs, hidden] rows sorted by expert ->
        [num_pairs, hidden]."""
        return run_experts(self.moe, routed, sorted_experts, gate_up, down, self.project)

    def fused(self, *tensors: torch.Tensor):
        """The C++ elementwise module where it runs these tensors (elementwise "cpp"; bf16, on
        the CPU, contiguous; the module built), else None: torch's ops. Both round alike."""
        if self.elementwise != "cpp" or not all(
            t.dtype == torch.bfloat16 and t.device.type == "cpu" and t.is_contiguous()
            for t in tensors
        ):
            return None
        return cpp.elementwise_kernels()

    def elementwise_in_use(self) -> str:
        """ "cpp" where the C++ elementwise kernels run with these Kernels, else "torch"."""
        return (
            "cpp"
            if self.elementwise == "cpp" and cpp.elementwise_kernels() is not None
            else "torch"
        )


@dataclass(frozen=True)
class AttentionChoice:
    name: str  # the fastest kernel (or the pinned one)
    seconds: dict[str, float]  # each kernel's fastest seconds on the timing wave
    gflops: dict[str, float]  # the same as GFLOP/s (q.k and p.v over visible keys)


@dataclass(frozen=True)
class StageKernels:
    """What `choose_kernels` chose, and what it measured (empty where it reused or was pinned)."""

    kernels: Kernels
    linear: KernelChoice
    attention: AttentionChoice | None  # None: the model has no GQA layer


# (device type, dtype) -> {"linear": name, "attention": name}: this process's choices
_process_choices: dict[tuple[str, torch.dtype], dict[str, str]] = {}


def choose_kernels(
    model: torch.nn.Module, spec, dtype: torch.dtype, device: torch.device
) -> StageKernels:
    """This process's kernel paths for a stage of `spec` (its `model` gives the projections'
    shapes): measured by the first stage of the process on this device type and dtype, reused
    by later ones, a pin in the environment always applied. On a CUDA device: the CUDA path
    (`cuda_kernels`), nothing timed (`model` unused), a pin applied."""
    key = (torch.device(device).type, dtype)
    if key[0] == "cuda":
        return _cuda_stage_kernels(spec, dtype, torch.device(device))
    elementwise = env.elementwise_kernel()
    if key == ("cpu", torch.bfloat16) and elementwise == "cpp":
        cpp.elementwise_kernels()  # built (the first time on a machine) before any wave
    chosen = _process_choices.setdefault(key, {})
    if "linear" not in chosen or env.linear_kernel_pin():
        linear = choose_linear(linear_shapes(model), dtype, device=device)
        chosen["linear"] = linear.name
    else:
        linear = KernelChoice(chosen["linear"], {}, 0.0)
    gqa = next((layer.attention for layer in spec.layers if layer.attention.kind == "gqa"), None)
    attention = None
    if gqa is not None:
        if "attention" not in chosen or env.attention_kernel_pin():
            attention = choose_attention(
                gqa.num_kv_heads,
                gqa.num_heads // gqa.num_kv_heads,
                gqa.head_dim,
                dtype,
                device=device,
            )
            chosen["attention"] = attention.name
        else:
            attention = AttentionChoice(chosen["attention"], {}, {})
    kernels = Kernels(linear.name, attention.name if attention else "chunked", elementwise)
    return StageKernels(kernels, linear, attention)


def cuda_kernels(spec, dtype: torch.dtype, device: torch.device | str | None = None) -> Kernels:
    """The CUDA path's kernels for a stage of `spec` (a ModelSpec) in `dtype`, nothing timed:
    F.linear, `varlen` (else `sdpa`) for GQA, MLA absorbed, the grouped GEMM for MoE where it
    applies (else sorted), torch's elementwise ops. `device`: the stage's CUDA device, whose
    compute capability decides varlen and the grouped GEMM; another device (a test on the CPU
    or the meta device) gets the same choices, with SDPA where varlen needs the GPU."""
    device = torch.device(device or "cpu")
    gqa = next((layer.attention for layer in spec.layers if layer.attention.kind == "gqa"), None)
    attention = "sdpa" if gqa is None else cuda_attention(gqa.head_dim, dtype, device)
    moe = [layer.mlp for layer in spec.layers if layer.mlp.kind == "moe"]
    grouped = all(
        grouped_applies(spec.hidden_size, mlp.intermediate_size, dtype, device) for mlp in moe
    )
    return Kernels(
        "linear", attention, "torch", mla="absorbed", moe="grouped" if moe and grouped else "sorted"
    )


def cuda_attention(head_dim: int, dtype: torch.dtype, device: torch.device) -> str:
    """The CUDA path's GQA kernel: `varlen` where `varlen_applies`, else `sdpa`."""
    return "varlen" if varlen_applies(head_dim, dtype, device) else "sdpa"


def choose_attention(
    kv_heads: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype,
    *,
    trials: int = 5,
    margin: float = 1.05,
    device: torch.device | str = "cpu",
) -> AttentionChoice:
    """Time every attention kernel, interleaved trial by trial (each kept at its fastest), on
    a wave like those of prefix-reuse workloads (4 chunks of 64 new tokens after a shared
    1,024-token prefix) with this model's heads, and return the fastest. `chunked` is the
    default: another kernel replaces it only if at least `margin` times faster (a noisy
    neighbour should not flip the choice). Takes about 0.3 s for SmolLM2's heads
    (`cpu_attention_kernels`, five trials; the first round in a process ran up to 10% off,
    hence more than three), and the first time on a machine the C++ softmax's build (about
    30 s). `WAVEPP_ATTENTION_KERNEL` (one of ATTENTION_KERNELS, or varlen on CUDA) skips the
    timing and returns that kernel.

    On a CUDA `device` nothing is timed (the candidates above are CPU kernels): `varlen` where
    `varlen_applies`, else `sdpa`."""
    device = torch.device(device)
    pinned = env.attention_kernel_pin()
    if pinned:
        check_attention(pinned)
        if pinned in CUDA_ATTENTION_KERNELS and device.type != "cuda":
            raise ValueError(
                f"WAVEPP_ATTENTION_KERNEL={pinned} runs on CUDA only; this stage runs on {device}"
            )
        return AttentionChoice(pinned, {}, {})
    if device.type == "cuda":
        return AttentionChoice(cuda_attention(head_dim, dtype, device), {}, {})
    block_size, prefix, new = 16, 1024, 64
    shared = tuple(range(prefix // block_size))
    chunks = [
        ChunkSpec(prefix, new, shared + tuple(range(100 + 4 * i, 104 + 4 * i)), i) for i in range(4)
    ]
    batch = StageBatch.build(chunks, block_size)
    gen = torch.Generator().manual_seed(0)
    num_slots = (100 + 16) * block_size
    key_cache = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(num_slots, kv_heads, head_dim, generator=gen).to(dtype)
    query = torch.randn(batch.num_tokens, kv_heads * group, head_dim, generator=gen).to(dtype)
    times: dict[str, list[float]] = {kernel: [] for kernel in cpu_attention_kernels(dtype)}
    for trial in range(trials + 1):  # the first round warms up
        for kernel in times:
            start = time.perf_counter()
            paged_attention(query, key_cache, value_cache, batch, head_dim**-0.5, kernel=kernel)
            if trial:
                times[kernel].append(time.perf_counter() - start)
    # the fastest of the trials: a neighbour taking the core only adds time, and a choice
    # flipped by noise would change the numerics of every later wave in this process
    seconds = {kernel: min(t) for kernel, t in times.items()}
    flops = attention_flops(
        kv_heads * group, head_dim, [(c.num_cached_tokens, c.num_tokens) for c in chunks]
    )
    best = min(seconds, key=seconds.get)
    if seconds["chunked"] < margin * seconds[best]:
        best = "chunked"
    return AttentionChoice(
        best, seconds, {kernel: flops / s / 1e9 for kernel, s in seconds.items()}
    )


def cpu_attention_kernels(dtype: torch.dtype) -> tuple[str, ...]:
    """The kernels `choose_attention` times on a CPU: ATTENTION_KERNELS, less those with the
    C++ softmax where it does not run (another dtype than fp32 / bf16, or the extension could
    not be built on this machine; building it the first time takes about half a minute), and
    `amx` where it does not (not bf16, no AMX-BF16, or its extension not built)."""
    fast = dtype in (torch.float32, torch.bfloat16) and cpp.softmax_kernels() is not None
    amx = dtype == torch.bfloat16 and cpp.amx_attention_kernels() is not None
    return tuple(
        k for k in ATTENTION_KERNELS if (fast or not k.endswith("_cpp")) and (amx or k != "amx")
    )


def attention_flops(num_heads: int, head_dim: int, chunks: list[tuple[int, int]]) -> float:
    """FLOPs of one layer's attention over chunks of (num_cached, num_new) tokens: q.k and p.v,
    2 * head_dim each, per head and per visible (query, key) pair."""
    visible = sum(new * cached + new * (new + 1) / 2 for cached, new in chunks)
    return 4.0 * num_heads * head_dim * visible


def _cuda_stage_kernels(spec, dtype: torch.dtype, device: torch.device) -> StageKernels:
    """`cuda_kernels`, with the linear and attention paths pinned in the environment applied."""
    kernels = cuda_kernels(spec, dtype, device)
    linear = choose_linear((), dtype, device=device)  # the pin, else F.linear: nothing timed
    has_gqa = any(layer.attention.kind == "gqa" for layer in spec.layers)
    attention = None
    if has_gqa:
        attention = AttentionChoice(env.attention_kernel_pin() or kernels.attention, {}, {})
        check_attention(attention.name)
    kernels = replace(
        kernels, linear=linear.name, attention=attention.name if attention else kernels.attention
    )
    return StageKernels(kernels, linear, attention)
