"""Mooncake's transfer engine, as both sides of the hand-off use it: one engine per process
side (each stage, each decode worker), peer to peer (`P2PHANDSHAKE`: no metadata server; a
peer is named by its "host:port" session), over TCP or RDMA.

    engine = TransferEngineHandle.start("10.0.0.5", "tcp")
    engine.session                                   "10.0.0.5:15291"
    engine.register(tensor)                          a host buffer others may read and write
    engine.read(session, [(local, remote, n), ...])  a batch, synchronous; TransferFailed
    engine.write(session, local, remote, n)

A read or write that makes no progress for `timeout_s` (a peer's link cut, a host gone) fails
with TransferFailed: the engine drops the connection (Mooncake's TCP transport,
`MC_TCP_PROGRESS_TIMEOUT_SEC`, which `start` sets for the process; its own default is 30 s).
A transfer that progresses, however slowly, is never cut short.

Only the standard library and mooncake are imported (torch tensors are what it registers): the
decode side runs this inside vLLM's environment, and the engine's options check a host with it.
The package is `mooncake-transfer-engine-non-cuda` (pinned by the Makefile); it needs Debian's
`libibverbs1` and `libnuma1` even for TCP.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import socket
import threading
from typing import TYPE_CHECKING

from wavepp.env import quiet_transfer_engine_logs, set_transfer_progress_timeout

if TYPE_CHECKING:
    import torch

PROTOCOLS = ("tcp", "rdma")
DEFAULT_TIMEOUT_S = 10.0  # a transfer with no progress for this long fails
INSTALL_HINT = (
    "pip install mooncake-transfer-engine-non-cuda==0.3.13.post1 (it needs the system "
    "libraries libibverbs1 and libnuma1: apt-get install libibverbs1 libnuma1)"
)


class TransferFailed(Exception):
    """A transfer the engine could not make (a peer gone, a session unknown, an address that
    peer never registered)."""


def check_installed() -> None:
    """RuntimeError, saying what to install, when the transfer engine's package is missing."""
    if importlib.util.find_spec("mooncake") is None:
        raise RuntimeError(
            f"the Mooncake KV transport needs Mooncake's transfer engine: {INSTALL_HINT}"
        )


def _import_engine():
    quiet_transfer_engine_logs()
    try:
        from mooncake.engine import TransferEngine
    except ImportError as err:
        raise RuntimeError(
            f"the Mooncake KV transport needs Mooncake's transfer engine: {INSTALL_HINT} ({err})"
        ) from None
    return TransferEngine


def local_host_for(remote_host: str) -> str:
    """The address this machine reaches `remote_host` from (the route's source; no packet is
    sent); 127.0.0.1 when there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((remote_host, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def default_host() -> str:
    """The address of this machine's default route (what another host most likely reaches),
    else 127.0.0.1. Deployments name it (--kv-host): a machine has many."""
    return local_host_for("192.0.2.1")  # TEST-NET-1: only the routing table is asked


def check_host(host: str) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            host = socket.gethostbyname(host)
        except OSError as err:
            raise ValueError(
                f"kv_host {host!r} is not an address this machine resolves: {err}"
            ) from None
    return host


def split_session(session: str) -> tuple[str, int]:
    host, _, port = str(session).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a transfer engine session is 'host:port', got {session!r}")
    return host, int(port)


class TransferEngineHandle:
    def __init__(self, engine, host: str, protocol: str):
        self._engine = engine
        self.host = host
        self.protocol = protocol
        self.session = f"{host}:{engine.get_rpc_port()}"
        self._registered: dict[int, torch.Tensor] = {}  # address -> the tensor, kept alive
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls, host: str, protocol: str = "tcp", timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> "TransferEngineHandle":
        """An engine on `host`; its transfers fail after `timeout_s` without progress (the
        setting is the process's: every engine it starts later shares it)."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"kv transport protocol must be one of {PROTOCOLS}, got {protocol!r}")
        if not timeout_s > 0:
            raise ValueError(f"the transfer timeout must be positive, got {timeout_s} s")
        host = check_host(host)
        set_transfer_progress_timeout(timeout_s)  # read by the engine's TCP transport at start
        engine = _import_engine()()
        # P2PHANDSHAKE: peers find each other by "host:port", no metadata service; "" lets the
        # engine pick the RDMA devices itself (unused over TCP)
        if engine.initialize(host, "P2PHANDSHAKE", protocol, "") != 0:
            raise RuntimeError(
                f"Mooncake's transfer engine did not start on {host} over {protocol} "
                "(its log above says why)"
            )
        return cls(engine, host, protocol)

    def register(self, tensor: torch.Tensor) -> int:
        """Make a contiguous host tensor readable and writable by peers; its address."""
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError("only a contiguous host tensor can be registered")
        addr = tensor.data_ptr()
        if self._engine.register_memory(addr, tensor.numel() * tensor.element_size()) != 0:
            raise RuntimeError(
                f"the transfer engine could not register {tensor.nbytes / 2**20:.1f} MiB"
            )
        with self._lock:
            self._registered[addr] = tensor
        return addr

    def unregister(self, tensor: torch.Tensor) -> None:
        with self._lock:
            if self._registered.pop(tensor.data_ptr(), None) is None:
                return
        self._engine.unregister_memory(tensor.data_ptr())

    def read(self, session: str, segments: list[tuple[int, int, int]]) -> None:
        """Pull each (local address, remote address, bytes) from `session`; TransferFailed."""
        if not segments:
            return
        local, remote, lengths = (list(column) for column in zip(*segments))
        if self._engine.batch_transfer_sync_read(session, local, remote, lengths) != 0:
            raise TransferFailed(f"reading {sum(lengths)} bytes from {session} failed")

    def write(self, session: str, local: int, remote: int, nbytes: int) -> None:
        if self._engine.transfer_sync_write(session, local, remote, nbytes) != 0:
            raise TransferFailed(f"writing {nbytes} bytes to {session} failed")

    def close(self) -> None:
        with self._lock:
            tensors = list(self._registered.values())
        for tensor in tensors:
            self.unregister(tensor)
