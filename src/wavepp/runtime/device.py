"""Where a stage computes: the CPU, or one CUDA device per stage process.

    device   "cpu" | "cuda" | "auto" (cuda when torch sees a CUDA device, else cpu)
    stage    under torchrun: cuda:LOCAL_RANK; locally spawned: stage i on cuda:(i % device_count)
    backend  the data plane's (activations): "nccl" when every stage has a GPU of its own,
             else "gloo" (CUDA activations then cross through host memory); the planes that
             carry pickled objects are gloo always (runtime/channels.py)

Everything here is checked on rank 0 before any stage process is spawned, so a bad setting
fails the Engine's start with its reason instead of a hang in the rendezvous.
"""

from __future__ import annotations

import os

import torch

from wavepp.engine_config import DEVICES

# the torch dtype of each EngineConfig.dtype (engine_config.DTYPES)
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def resolve_device(device: str) -> str:
    """ "cpu" or "cuda" for a `device` setting. Raises ValueError for an unknown name, and for
    "cuda" when this torch has no CUDA device to use (naming what it found)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        build = torch.version.cuda
        why = (
            f"this torch ({torch.__version__}) is a CPU-only build"
            if build is None
            else f"this torch is built for CUDA {build} but sees no CUDA device "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r}, or no driver)"
        )
        raise ValueError(f"device='cuda' asked for, but {why}; use device='cpu' or 'auto'")
    return device


def default_backend(device: str, num_stages: int) -> str:
    """The data plane's backend for a resolved device: nccl when each local stage process has a
    GPU of its own, gloo otherwise (NCCL refuses two ranks on one GPU)."""
    if device != "cuda" or num_stages == 1:
        return "gloo"
    return "nccl" if _local_processes(num_stages) <= torch.cuda.device_count() else "gloo"


def check_backend(device: str, backend: str, num_stages: int) -> None:
    """Raise ValueError when `backend` cannot carry this pipeline's activations."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend != "nccl" or num_stages == 1:
        return
    if device != "cuda":
        raise ValueError(
            "backend='nccl' moves CUDA tensors only; with device='cpu' use backend='gloo'"
        )
    local, count = _local_processes(num_stages), torch.cuda.device_count()
    if local > count:
        raise ValueError(
            f"backend='nccl' needs a GPU per stage process: {local} stage processes on "
            f"this machine, {count} CUDA device(s); NCCL refuses two ranks on one GPU. "
            f"Use backend='gloo' (or leave it unset) to share GPUs"
        )


def stage_device(device: str, local_rank: int) -> torch.device:
    """The torch.device of the stage process with this node-local rank (torchrun's LOCAL_RANK;
    a locally spawned stage's rank) for a resolved `device`: cuda:(local_rank % device_count),
    so stages share GPUs round-robin when there are fewer GPUs than stages."""
    if device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device` (a CUDA device runs asynchronously to the host:
    a clock read without this measures the launch, not the compute). No-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _local_processes(num_stages: int) -> int:
    # under torchrun, the ranks of this node; else every stage is a local process
    return int(os.environ.get("LOCAL_WORLD_SIZE", num_stages))
