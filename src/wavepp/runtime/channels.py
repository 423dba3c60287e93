"""The planes between ranks, on torch.distributed: one process group per direction of traffic,
so that each group has one sending thread and one receiving thread on any pair of ranks.

    rounds   leader (rank 0) -> stage s     admission messages        (gloo)
    replies  stage s -> leader              their answers             (gloo)
    headers  stage s -> stage s+1           wave headers              (gloo)
    data     stage s -> stage s+1           activations               (gloo on CPU, NCCL on GPU)
    results  last stage -> leader           first tokens, timings     (gloo)

Objects travel pickled as uint8 tensors (length first). Nothing home-made for rendezvous:
init_process_group with the env:// method (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), as
torchrun sets them.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


class PeerLostError(RuntimeError):
    """A peer rank went away (its process died or closed the connection)."""


@dataclass(frozen=True)
class Shutdown:
    """Ends the loops that receive it."""


class Channels:
    def __init__(self, rank: int, world_size: int, backend: str = "gloo", *,
                 init_method: str = "env://", timeout_s: float = 1800):
        self.rank, self.world_size = rank, world_size
        if world_size == 1:
            self.groups = {}
            return
        if not dist.is_initialized():
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=timeout_s))
        # every rank creates the groups in the same order
        self.groups = {name: dist.new_group(backend="gloo") for name in
                       ("rounds", "replies", "headers", "results")}
        self.groups["data"] = dist.new_group(backend=backend)

    def send_obj(self, obj, dst: int, plane: str) -> None:
        payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)),
                                   dtype=torch.uint8)
        self._send(torch.tensor([payload.numel()], dtype=torch.int64), dst, plane)
        self._send(payload, dst, plane)

    def recv_obj(self, src: int, plane: str):
        size = torch.empty(1, dtype=torch.int64)
        self._recv(size, src, plane)
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self._recv(payload, src, plane)
        return pickle.loads(payload.numpy().tobytes())

    def send_tensor(self, tensor: torch.Tensor, dst: int) -> None:
        # bf16 travels as its bit pattern (int16): every backend moves those
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.int16)
        self._send(tensor.contiguous(), dst, "data")

    def recv_tensor(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
        wire = torch.int16 if dtype == torch.bfloat16 else dtype
        out = torch.empty(shape, dtype=wire)
        self._recv(out, src, "data")
        return out.view(dtype) if dtype == torch.bfloat16 else out

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    def _send(self, tensor: torch.Tensor, dst: int, plane: str) -> None:
        try:
            dist.send(tensor, dst, group=self.groups[plane])
        except RuntimeError as exc:
            raise PeerLostError(f"rank {self.rank}: sending to rank {dst} on the {plane} plane "
                                f"failed: {exc}") from exc

    def _recv(self, tensor: torch.Tensor, src: int, plane: str) -> None:
        try:
            dist.recv(tensor, src, group=self.groups[plane])
        except RuntimeError as exc:
            raise PeerLostError(f"rank {self.rank}: receiving from rank {src} on the {plane} plane "
                                f"failed: {exc}") from exc
