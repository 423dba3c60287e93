"""The planes between ranks, on torch.distributed: one process group per direction of traffic,
so that each group has one sending thread and one receiving thread on any pair of ranks.

    rounds   leader (rank 0) -> stage s     admission messages        (gloo)
    replies  stage s -> leader              their answers             (gloo)
    headers  stage s -> stage s+1           wave headers              (gloo)
    data     stage s -> stage s+1           activations               (gloo on CPU, NCCL on GPU)
    results  last stage -> leader           first tokens, timings     (gloo)
    queries  rank 0 -> stage s              cache queries (a router's) (gloo)
    answers  stage s -> rank 0              their answers             (gloo)

Objects travel pickled as uint8 tensors, always over gloo on the host: a fixed-size first
message (`INLINE_BYTES`: the length, then as much of the pickle as fits) and, for a larger
object, the rest in a second one. Nearly every object (admission messages, wave headers,
results) fits the first, so it costs one message, not a length and a payload: on loopback a
gloo message's latency hardly depends on its size at these sizes. They are
made and read by Python on the host, and a pickle sent over NCCL would cost a copy to the GPU
and back plus a stream synchronization for a few hundred bytes. Only the data plane takes the
`backend` argument: with NCCL its tensors stay on the stage's GPU (`device`), with gloo they
cross through host memory (the CPU, or GPUs shared by several stages, which NCCL refuses).
The default process group is gloo and carries nothing; every plane is a group of its own. Nothing home-made for rendezvous:
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
    def __init__(
        self,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        *,
        init_method: str = "env://",
        timeout_s: float = 1800,
        device: torch.device | str = "cpu",
    ):
        """`device`: this rank's compute device. With backend "nccl" it must be a CUDA device;
        it becomes the process's current device (NCCL binds a rank to it)."""
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.device = device = torch.device(device)
        if backend == "nccl" and device.type != "cuda":
            raise ValueError(
                f"the nccl data plane moves CUDA tensors; rank {rank} computes on {device}"
            )
        # where the data plane's tensors live: the GPU under NCCL, host memory under gloo
        self.data_device = device if backend == "nccl" else torch.device("cpu")
        if world_size == 1:
            self.groups = {}
            return
        if backend == "nccl":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(
                "gloo",
                init_method=init_method,
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=timeout_s),
            )
        # every rank creates the groups in the same order
        self.groups = {
            name: dist.new_group(backend="gloo")
            for name in ("rounds", "replies", "headers", "results", "queries", "answers")
        }
        self.groups["data"] = dist.new_group(backend=backend)

    def send_obj(self, obj, dst: int, plane: str) -> None:
        for part in pack_obj(obj):
            self._send(part, dst, plane)

    def recv_obj(self, src: int, plane: str):
        first = torch.empty(INLINE_BYTES, dtype=torch.uint8)
        self._recv(first, src, plane)
        rest_bytes = rest_size(first)
        rest = None
        if rest_bytes:
            rest = torch.empty(rest_bytes, dtype=torch.uint8)
            self._recv(rest, src, plane)
        return unpack_obj(first, rest)

    def send_tensor(self, tensor: torch.Tensor, dst: int) -> None:
        """Send `tensor` (on any device) to rank `dst`; it is copied to the data plane's device
        first where it lives elsewhere (a GPU's activations under gloo)."""
        tensor = tensor.to(self.data_device).contiguous()
        self._send(tensor.view(_wire_dtype(tensor.dtype, self.backend)), dst, "data")

    def recv_tensor(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
        """A tensor from rank `src`, on `data_device` (the caller moves it to its own device).
        Under NCCL the receive is ordered before later work on this device's current stream,
        not finished on return (ProcessGroupNCCL's wait)."""
        out = torch.empty(shape, dtype=_wire_dtype(dtype, self.backend), device=self.data_device)
        self._recv(out, src, "data")
        return out.view(dtype)

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    def _send(self, tensor: torch.Tensor, dst: int, plane: str) -> None:
        try:
            dist.send(tensor, dst, group=self.groups[plane])
        except RuntimeError as exc:
            raise PeerLostError(
                f"rank {self.rank}: sending to rank {dst} on the {plane} plane failed: {exc}"
            ) from exc

    def _recv(self, tensor: torch.Tensor, src: int, plane: str) -> None:
        try:
            dist.recv(tensor, src, group=self.groups[plane])
        except RuntimeError as exc:
            raise PeerLostError(
                f"rank {self.rank}: receiving from rank {src} on the {plane} plane failed: {exc}"
            ) from exc


INLINE_BYTES = 4096  # the first message of an object: 8 bytes of length, then the pickle's start
_LEN = 8


def pack_obj(obj) -> list[torch.Tensor]:
    """The messages that carry `obj`: INLINE_BYTES (length + the pickle's start), then the rest
    of the pickle if it did not fit."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    first = bytearray(INLINE_BYTES)
    first[:_LEN] = len(data).to_bytes(_LEN, "little")
    inline = min(len(data), INLINE_BYTES - _LEN)
    first[_LEN : _LEN + inline] = data[:inline]
    parts = [torch.frombuffer(first, dtype=torch.uint8)]
    if inline < len(data):
        parts.append(torch.frombuffer(bytearray(data[inline:]), dtype=torch.uint8))
    return parts


def rest_size(first: torch.Tensor) -> int:
    """Bytes of the second message that follows `first` (0: the object fit in the first)."""
    size = int.from_bytes(first[:_LEN].numpy().tobytes(), "little")
    return max(0, size - (INLINE_BYTES - _LEN))


def unpack_obj(first: torch.Tensor, rest: torch.Tensor | None):
    size = int.from_bytes(first[:_LEN].numpy().tobytes(), "little")
    data = first[_LEN : _LEN + min(size, INLINE_BYTES - _LEN)].numpy().tobytes()
    if rest is not None:
        data += rest.numpy().tobytes()
    if len(data) != size:
        raise ValueError(f"object message of {size} bytes arrived with {len(data)}")
    return pickle.loads(data)


def _wire_dtype(dtype: torch.dtype, backend: str) -> torch.dtype:
    # gloo: bf16 travels as its bit pattern (int16), which every gloo build moves; NCCL moves
    # bf16 itself and has no 16-bit integer type
    return torch.int16 if dtype == torch.bfloat16 and backend == "gloo" else dtype
