"""Hosts of a test's own: Linux network namespaces, each with an address of its own on one
bridge, and what a network does to them (a link cut, a bandwidth cap, added latency and loss).

    with Network(["prefill", "decode", "route"]) as net:    # pytest.skip where it cannot be made
        net.address("prefill")                              "10.213.37.2"
        proc = net.start("prefill", cmd, log_path, env)     the command inside that host
        net.cut("decode"); net.restore("decode")            its link down, then up again
        net.cap("prefill", "100mbit"); net.uncap("prefill") a token bucket both ways (tc tbf)
        net.delay("decode", "100ms", loss="5%")             tc netem; pytest.skip where the
                                                            kernel has no netem

The test process itself is one more host: the bridge, in its namespace, holds the network's
first address (`client_address`), so a test talks to the hosts over the bridge, as a client
on that network would. Nothing else holds an address there: the subnet (10.213.N.0/24) is one
no route of this machine covers. Every process started in a host runs in a session of its own
and is killed with its children (SIGTERM, then SIGKILL) when the network closes, whatever
happened; then the namespaces and the bridge are deleted (each host's veth pair goes with its
namespace). Needs root and iproute2 (`ip`, `tc`).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["tc", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "network namespaces need iproute2 (ip, tc)"
    probe = f"wpp-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.213.0.0/16 that no address or route of this machine covers."""
    taken = _ip("-4", "route", "show", "table", "all").stdout + _ip("-4", "addr").stdout
    used = []
    for word in taken.split():
        try:
            used.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    start = os.getpid() % 200
    for k in range(256):
        net = ipaddress.ip_network(f"10.213.{(start + k) % 250 + 1}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise RuntimeError("no free /24 in 10.213.0.0/16 for the test network")


class Network:
    def __init__(self, hosts: list[str]):
        why = unavailable()
        if why is not None:
            pytest.skip(why)
        tag = f"{os.getpid() % 100000}"
        self.subnet = _free_subnet()
        addrs = list(self.subnet.hosts())
        self.client_address = str(addrs[0])
        self.bridge = f"wpb{tag}"
        self._hosts = {
            name: {"ns": f"wpp-{tag}-{name}", "port": f"wv{tag}h{i}", "addr": str(addrs[i + 1])}
            for i, name in enumerate(hosts)
        }
        self._procs: list[subprocess.Popen] = []
        self._closed = False
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def address(self, host: str) -> str:
        return self._hosts[host]["addr"]

    def start(
        self, host: str, cmd: list[str], log: Path, env: dict | None = None
    ) -> subprocess.Popen:
        """`cmd` inside `host` (its own session; output to `log`), killed at close."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self._hosts[host]["ns"], *cmd],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        """`proc` and every process of its session: SIGTERM, then SIGKILL after 5 s."""
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _group_alive(proc.pid):
                proc.poll()
                time.sleep(0.1)
            if not _group_alive(proc.pid):
                break
        proc.poll()

    def cut(self, host: str) -> None:
        """The host's link down: nothing reaches it, nothing leaves it (its processes run on)."""
        _ip("link", "set", self._hosts[host]["port"], "down")

    def restore(self, host: str) -> None:
        _ip("link", "set", self._hosts[host]["port"], "up")

    def cap(self, host: str, rate: str) -> None:
        """A token bucket of `rate` (tc's units: "100mbit") on the host's link, both ways."""
        for end in self._ends(host):
            _tc(
                *end[0],
                "qdisc",
                "replace",
                "dev",
                end[1],
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "64kb",
                "latency",
                "200ms",
            )

    def uncap(self, host: str) -> None:
        """The host's link as it was: no cap, no delay."""
        for end in self._ends(host):
            _tc(*end[0], "qdisc", "del", "dev", end[1], "root", check=False)

    def delay(self, host: str, delay: str, loss: str | None = None) -> None:
        """`delay` added each way on the host's link, and `loss` of the packets (tc netem);
        pytest.skip where this kernel has no netem."""
        extra = ["loss", loss] if loss else []
        for end in self._ends(host):
            done = _tc(
                *end[0],
                "qdisc",
                "replace",
                "dev",
                end[1],
                "root",
                "netem",
                "delay",
                delay,
                *extra,
                check=False,
            )
            if done.returncode != 0:
                self.uncap(host)
                pytest.skip(f"this kernel has no netem (tc: {done.stderr.strip()})")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            self.kill(proc)
        for host in self._hosts.values():
            # the pair goes now (a namespace's own devices go with it later, asynchronously:
            # the next network of this process would find the port's name taken)
            _ip("link", "del", host["port"], check=False)
            _ip("netns", "del", host["ns"], check=False)
        _ip("link", "del", self.bridge, check=False)

    # ---- private helpers --------------------------------------------------------------------

    def _make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.client_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self._hosts.values():
            ns, port = host["ns"], host["port"]
            _ip("netns", "add", ns)
            _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", port, "master", self.bridge)
            _ip("link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{host['addr']}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def _ends(self, host: str) -> list[tuple[list[str], str]]:
        """The host's two ends as (tc's namespace options, device): the bridge port (what
        reaches the host) and the host's eth0 (what leaves it)."""
        h = self._hosts[host]
        return [([], h["port"]), (["-n", h["ns"]], "eth0")]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # zombies of the group count as gone
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
