"""Mooncake's transfer engine, as both sides of the hand-off use it: one engine per process
side (each stage, each decode worker), peer to peer (`P2PHANDSHAKE`: no metadata server; a
peer is named by its "host:port" session), over TCP or RDMA.

    engine = TransferEngineHandle.start("10.0.0.5", "tcp")
    engine.session                                   "10.0.0.5:15291"
    engine.register(tensor)                          a host buffer others may read and write
    engine.read(session, [(local, remote, n), ...])  a batch, synchronous; TransferFailed
    engine.write(session, local, remote, n)

Every wait is bounded, as a peer's link cut or a host gone must not hold a decode step:
- a transfer on a connection that stops making progress for `timeout_s` fails: Mooncake's TCP
  transport drops it (`MC_TCP_PROGRESS_TIMEOUT_SEC`, which `start` sets for the process);
- the engine's connect has no bound of its own (a new connection to a host that stopped
  answering waits on the kernel: its neighbour entry failing, or the SYN retries, 20 s to
  2 min). So each call runs on a thread of its own, and a call not done after `timeout_s`
  gets its peer probed (a TCP connect to its session's port, bounded by `timeout_s`): a peer
  that does not answer fails the call with PeerUnreachable, at most 2 x `timeout_s` in. The
  call itself cannot be cancelled and runs on until the kernel gives up: its local buffers
  are the caller's to set aside until `PeerUnreachable.done` (puller.py does). A peer that
  answers the probe is waited on again: a transfer that progresses, however slowly, is not
  cut short (up to the engine's own deadline, `MC_TRANSFER_TIMEOUT`, set to 600 s, past
  which it returns with the transfer still running).

Only the standard library and mooncake are imported (torch tensors are what it registers): the
decode side runs this inside vLLM's environment, and the engine's options check a host with it.
The package is `mooncake-transfer-engine-non-cuda` (pinned by the Makefile); it needs Debian's
`libibverbs1` and `libnuma1` even for TCP.
"""

from __future__ import annotations

import errno
import importlib.util
import ipaddress
import select
import socket
import threading
import time
from typing import TYPE_CHECKING

from wavepp.env import (
    quiet_transfer_engine_logs,
    set_transfer_call_deadline,
    set_transfer_progress_timeout,
)

if TYPE_CHECKING:
    import torch

PROTOCOLS = ("tcp", "rdma")
DEFAULT_TIMEOUT_S = 10.0  # a transfer with no progress for this long fails
CALL_DEADLINE_S = 600.0  # the engine's own: past it a call returns with its transfer running
INSTALL_HINT = (
    "pip install mooncake-transfer-engine-non-cuda==0.3.13.post1 (it needs the system "
    "libraries libibverbs1 and libnuma1: apt-get install libibverbs1 libnuma1)"
)


class TransferFailed(Exception):
    """A transfer the engine could not make (a peer gone, a session unknown, an address that
    peer never registered)."""


class PeerUnreachable(TransferFailed):
    """A transfer not done after the timeout whose peer did not take a TCP connection within
    it either. The engine's call runs on: `done` is set when it returns, and until then the
    local buffers it names may still be read or written."""

    def __init__(self, message: str, host: str, done: threading.Event):
        super().__init__(message)
        self.host = host
        self.done = done


class SetAside:
    """Registered tensors a call still running may read or write (a PeerUnreachable's): kept
    registered and alive until it returns, then unregistered by `reclaim`."""

    def __init__(self) -> None:
        self._held: list[tuple[threading.Event, list[torch.Tensor]]] = []

    def add(self, done: threading.Event, tensors: list[torch.Tensor]) -> None:
        self._held.append((done, tensors))

    def reclaim(self, engine: "TransferEngineHandle") -> None:
        for done, tensors in self._held:
            if done.is_set():
                for tensor in tensors:
                    engine.unregister(tensor)
        self._held = [(done, tensors) for done, tensors in self._held if not done.is_set()]

    def __len__(self) -> int:
        """How many calls still run."""
        return sum(not done.is_set() for done, _ in self._held)


def reachable(host: str, port: int, timeout_s: float, done: threading.Event | None = None) -> bool:
    """Whether `host` answers a TCP connect to `port` within `timeout_s` (a refusal is an
    answer: the host is there). True as soon as `done` is set, if given: the call the probe
    was for returned."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        err = probe.connect_ex((host, port))
        deadline = time.monotonic() + timeout_s
        while err == errno.EINPROGRESS:
            if done is not None and done.is_set():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if select.select([], [probe], [], min(left, 0.05))[1]:
                err = probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        return err in (0, errno.ECONNREFUSED)


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
    def __init__(self, engine, host: str, protocol: str, timeout_s: float = DEFAULT_TIMEOUT_S):
        self._engine = engine
        self.host = host
        self.protocol = protocol
        self.timeout_s = timeout_s
        self.session = f"{host}:{engine.get_rpc_port()}"
        self._registered: dict[int, torch.Tensor] = {}  # address -> the tensor, kept alive
        self._stuck: dict[str, threading.Event] = {}  # session -> its call still running
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
        set_transfer_call_deadline(CALL_DEADLINE_S)
        engine = _import_engine()()
        # P2PHANDSHAKE: peers find each other by "host:port", no metadata service; "" lets the
        # engine pick the RDMA devices itself (unused over TCP)
        if engine.initialize(host, "P2PHANDSHAKE", protocol, "") != 0:
            raise RuntimeError(
                f"Mooncake's transfer engine did not start on {host} over {protocol} "
                "(its log above says why)"
            )
        return cls(engine, host, protocol, timeout_s)

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
        """Pull each (local address, remote address, bytes) from `session`; TransferFailed
        (PeerUnreachable: the call runs on, see the module's docstring)."""
        if not segments:
            return
        local, remote, lengths = (list(column) for column in zip(*segments))
        what = f"reading {sum(lengths)} bytes from {session}"
        self._call(session, what, self._engine.batch_transfer_sync_read, local, remote, lengths)

    def write(self, session: str, local: int, remote: int, nbytes: int) -> None:
        what = f"writing {nbytes} bytes to {session}"
        self._call(session, what, self._engine.transfer_sync_write, local, remote, nbytes)

    def _call(self, session: str, what: str, fn, *args) -> None:
        host, port = split_session(session)
        with self._lock:
            self._stuck = {s: e for s, e in self._stuck.items() if not e.is_set()}
            stuck = self._stuck.get(session)
        if stuck is not None and not reachable(host, port, self.timeout_s):
            # no second call to a peer one is still waiting on: it would wait the same way
            raise PeerUnreachable(f"{what}: {host} does not answer", host, stuck)
        done = threading.Event()
        status: list = []

        def run() -> None:
            try:
                status.append(fn(session, *args))
            except BaseException as err:  # handed to the caller below
                status.append(err)
            finally:
                done.set()

        threading.Thread(target=run, name="wavepp-transfer", daemon=True).start()
        t0 = time.monotonic()
        while not done.wait(self.timeout_s):
            if not reachable(host, port, self.timeout_s, done):
                with self._lock:
                    self._stuck[session] = done
                waited = time.monotonic() - t0
                raise PeerUnreachable(
                    f"{what}: not done after {waited:.1f} s and {host} does not answer",
                    host,
                    done,
                )
        if isinstance(status[0], BaseException):
            raise status[0]
        if status[0] != 0:
            raise TransferFailed(f"{what} failed")

    def close(self) -> None:
        with self._lock:
            tensors = list(self._registered.values())
        for tensor in tensors:
            self.unregister(tensor)
