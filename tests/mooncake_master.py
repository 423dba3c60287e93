"""A real Mooncake Store master on loopback, run from the venv's `mooncake_master` (the
wheel the project installs): what the shared KV tier's tests talk to. No mock."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from wavepp.runtime.launch import free_port


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class MooncakeMaster:
    """`mooncake_master` with its HTTP metadata server, on free loopback ports; start, kill and
    start again on the same ports (what a restarted master looks like to clients)."""

    def __init__(self, log_dir: Path) -> None:
        binary = Path(sys.executable).parent / "mooncake_master"
        self.binary = str(binary) if binary.exists() else shutil.which("mooncake_master")
        if self.binary is None:
            raise FileNotFoundError("mooncake_master is not installed (make test installs it)")
        # its metrics (admin) port too: the default, 9003, is taken by any other master here
        self.rpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def start(self) -> "MooncakeMaster":
        log_path = self.log_dir / f"mooncake_master.{time.time_ns()}.log"
        log = open(log_path, "w")
        self.process = subprocess.Popen(
            [
                self.binary,
                "-rpc_port",
                str(self.rpc_port),
                "-enable_http_metadata_server=true",
                "-http_metadata_server_port",
                str(self.http_port),
                "-metrics_port",
                str(self.metrics_port),
                # a read leases its entry (10 s by default): a test that replaces an entry it
                # read waits that out
                "-default_kv_lease_ttl=1000",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while not (_listening(self.rpc_port) and _listening(self.http_port)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                errors = [ln for ln in log_path.read_text().splitlines() if ln.startswith("E")]
                raise RuntimeError(f"mooncake_master did not start: {errors[-3:]}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None
