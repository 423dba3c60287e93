"""Starting the stage processes.

Locally, rank 0 is the calling process and ranks 1..S-1 are spawned on 127.0.0.1, rendezvous
through torch.distributed's TCP store. Across machines, every rank runs the same program under
torchrun, which sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; rank 0 serves the API and
the other ranks run `run_worker` (the `wavepp` command does this by itself).

A spawned stage dies with rank 0 (PR_SET_PDEATHSIG), and rank 0's watchdog turns a stage
that exits into a clear error naming it.

A local pipeline may pin each stage to CPUs of its own (`stage_cpu_sets`; the Engine does it
by default on the CPU): rank r's process runs on the r-th of equal, disjoint sets of the CPUs
this process may use; rank 0's threads on the first while the stages load, and once the engine
runs only the thread that computes stage 0 (`LocalCluster.keep_stage_0_to`). Unpinned, with
other work on the machine the scheduler let two stages share a core while the other work held
the rest (docs/benchmarks/2026-12-04-pinned-stages.md: 1.2-2x slower); pinned, each keeps its own.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import multiprocessing.connection
import os
import random
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

import torch.distributed as dist

from wavepp.runtime.channels import Channels
from wavepp.runtime.device import stage_device

# where free_port looks first: below the kernel's range for the local ends of outgoing
# connections, so that no connection made between the pick and the bind takes the port
_PORT_FLOOR = 10_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on now, for a server that binds it later.

    A port from bind(("", 0)) comes from the ephemeral range, the one the kernel also gives the
    local end of every outgoing connection: between the pick and the server's bind (a stage's
    seconds of start-up) any connection on the machine may take it. So the port is drawn at
    random below that range, where only another explicit bind can take it, and checked free;
    where the range cannot be read or leaves no room below it, the kernel picks."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    rng = random.SystemRandom()
    for _ in range(64 if low > _PORT_FLOOR + 1_000 else 0):
        port = rng.randrange(_PORT_FLOOR, low)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torchrun_rank() -> tuple[int, int] | None:
    """(rank, world size) when started by torchrun with more than one rank, else None."""
    if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


class StageStartError(RuntimeError):
    """A stage process exited before the pipeline was up."""


def torchrun_local_rank() -> int:
    """This process's rank on its node under torchrun (LOCAL_RANK)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


RUN_DIR_PREFIX = "wavepp-"  # run directories: wavepp-<owner pid>-<random>, in the temp dir


def remove_stale_run_dirs(tmp_dir: str | None = None) -> list[str]:
    """Remove the run directories whose owner process is gone (it was killed, so it could not
    clean up after itself); return their paths. Directories of live owners, and directories
    not named by this module, are left alone."""
    removed = []
    for path in Path(tmp_dir or tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*-*"):
        owner = path.name[len(RUN_DIR_PREFIX) :].split("-", 1)[0]
        if not owner.isdigit() or not path.is_dir() or _alive(int(owner)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def stage_cpu_sets(
    num_stages: int, cpus: Iterable[int] | None = None
) -> list[tuple[int, ...]] | None:
    """The CPUs each stage of a local pipeline is pinned to: `cpus` (default: the CPUs this
    process may run on), in order, split into `num_stages` contiguous sets of equal size (a
    remainder stays unused). None when there are fewer CPUs than stages: two stages would share
    a core whatever the pinning."""
    ordered = sorted(os.sched_getaffinity(0) if cpus is None else set(cpus))
    per_stage = len(ordered) // num_stages
    if per_stage == 0:
        return None
    return [tuple(ordered[r * per_stage : (r + 1) * per_stage]) for r in range(num_stages)]


def pinned_cpu_sets(
    num_stages: int, device: str, pin_cpus: bool | None
) -> list[tuple[int, ...]] | None:
    """The CPU sets a local pipeline of `num_stages` pins its stages to (`stage_cpu_sets`), or
    None: a single stage, `pin_cpus` False, or None (the default) on a GPU or where there are
    fewer CPUs than stages. `pin_cpus` True there is a ValueError."""
    if num_stages < 2 or pin_cpus is False or (pin_cpus is None and device != "cpu"):
        return None
    sets = stage_cpu_sets(num_stages)
    if sets is None and pin_cpus:
        raise ValueError(
            f"pin_cpus needs a CPU per stage: pp={num_stages}, and this process may run on "
            f"{len(os.sched_getaffinity(0))} CPU(s)"
        )
    return sets


def pin_threads(cpus: Iterable[int], but: Iterable[int] = ()) -> None:
    """Pin every thread of this process but the native thread ids `but` to `cpus` (threads
    started later inherit the mask of the thread that starts them)."""
    cpus, skip = set(cpus), set(but)
    for tid in os.listdir("/proc/self/task"):
        if int(tid) in skip:
            continue
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


class LocalCluster:
    """Ranks 1..S-1 as child processes of this one; rank 0's Channels. `device`: "cpu" or
    "cuda" (resolved, runtime/device.py); each rank's Channels.device is its own. `cpu_sets`:
    one CPU set per rank (`stage_cpu_sets`) to pin each rank's process to, rank 0's threads
    until close(); None: no pinning (and none under torchrun, which places its own ranks)."""

    def __init__(
        self,
        num_stages: int,
        backend: str = "gloo",
        device: str = "cpu",
        cpu_sets: Sequence[Sequence[int]] | None = None,
    ):
        if not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(
                f"pp (the number of pipeline stages) must be a positive integer, got {num_stages!r}"
            )
        if cpu_sets is not None and len(cpu_sets) != num_stages:
            raise ValueError(
                f"cpu_sets needs one CPU set per stage ({num_stages}), got {len(cpu_sets)}"
            )
        self.cpu_sets = None if cpu_sets is None else [tuple(c) for c in cpu_sets]
        self._unpinned: set[int] | None = None  # rank 0's CPUs before pinning, restored by close()
        remove_stale_run_dirs()
        self.run_dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")
        self.procs: list[mp.Process] = []
        try:
            self._start(num_stages, backend, device)
        except BaseException:
            self.close(timeout_s=2)
            raise

    def _start(self, num_stages: int, backend: str, device: str) -> None:
        if torchrun_rank() is not None:
            rank, world = torchrun_rank()
            if world != num_stages:
                raise ValueError(f"torchrun started {world} ranks but pp={num_stages}")
            self.cpu_sets = None
            self.channels = Channels(
                rank,
                world,
                backend,
                init_method="env://",
                device=stage_device(device, torchrun_local_rank()),
            )
            return
        if num_stages == 1:
            self.cpu_sets = None
            self.channels = Channels(0, 1, device=stage_device(device, 0))
            return
        if dist.is_available() and dist.is_initialized():
            raise RuntimeError(
                "another pipeline (an Engine with pp > 1) is running in this process: "
                "torch.distributed holds one process group per process; shut it down first"
            )
        init = f"tcp://127.0.0.1:{free_port()}"
        ctx = mp.get_context("spawn")
        for rank in range(1, num_stages):
            cpus = None if self.cpu_sets is None else self.cpu_sets[rank]
            proc = ctx.Process(
                target=_worker_main,
                args=(rank, num_stages, backend, device, init, self.run_dir, cpus),
                name=f"wavepp-stage{rank}",
                daemon=True,
            )
            proc.start()
            self.procs.append(proc)
        self._joining = True  # from here on, a failure may leave a half-made process group
        self.channels = self._rendezvous(
            lambda: Channels(
                0, num_stages, backend, init_method=init, device=stage_device(device, 0)
            )
        )
        if self.cpu_sets is not None:
            self._unpinned = os.sched_getaffinity(0)
            pin_threads(self.cpu_sets[0])

    def keep_stage_0_to(self, compute_tids: Iterable[int]) -> None:
        """Once rank 0 runs: the threads that compute stage 0 (native ids; called before they
        run a forward, so torch's intra-op workers they start inherit their mask) keep its
        CPUs, and every other thread of rank 0 (the front door's HTTP server and tokenizers,
        the admission rounds, the results; threads they start later inherit it) runs on all
        the CPUs this process had, wherever the scheduler finds room. On stage 0's one core
        they made stage 0 the pipeline's slowest; moved, a burst of 32 prompts ended 0.30-0.50 s
        sooner (docs/benchmarks/2026-12-07-front-door-tail-3.md). Nothing when not pinned."""
        if self.cpu_sets is None or self._unpinned is None:
            return
        tids = set(compute_tids)
        for tid in tids:
            os.sched_setaffinity(tid, set(self.cpu_sets[0]))
        pin_threads(self._unpinned, but=tids)

    def _rendezvous(self, connect, poll_s: float = 0.2) -> Channels:
        """Join the process group while watching the children: a stage that dies before it
        joins (an import error, a script without a __main__ guard under spawn, an out-of-memory
        kill) fails the start at once with its reason, instead of a wait for the rendezvous
        timeout."""
        box: dict = {}

        def run():
            try:
                box["channels"] = connect()
            except BaseException as exc:  # re-raised below, in the caller
                box["error"] = exc

        joiner = threading.Thread(target=run, name="wavepp-rendezvous", daemon=True)
        joiner.start()
        while joiner.is_alive():
            joiner.join(poll_s)
            reason = self.dead_stage() if joiner.is_alive() else None
            if reason:
                for proc in self.procs:
                    if proc.is_alive():
                        proc.kill()
                raise StageStartError(f"pipeline failed to start: {reason}")
        if "error" in box:
            raise box["error"]
        return box["channels"]

    def dead_stage(self, wait_s: float = 0.0) -> str | None:
        """A reason naming the first stage process that exited, or None. With `wait_s`, wait
        up to that long for one to exit: a peer that dropped its connection is exiting, and its
        sockets close a moment before its exit status is there (and the watchdog thread may be
        reaping it at the same time)."""
        deadline = time.monotonic() + wait_s
        while True:
            reason = self._first_exited()
            remaining = deadline - time.monotonic()
            if reason or remaining <= 0 or not self.procs:
                return reason
            mp.connection.wait([p.sentinel for p in self.procs], timeout=min(remaining, 0.05))

    def _first_exited(self) -> str | None:
        for rank, proc in enumerate(self.procs, start=1):
            if proc.exitcode is not None:
                report = Path(self.run_dir, f"stage{rank}.error")
                if report.exists():
                    detail = report.read_text().splitlines()[0]
                elif proc.exitcode < 0:
                    detail = f"killed by {signal.Signals(-proc.exitcode).name}"
                else:
                    detail = "no report (it died before wavepp ran in it; its stderr says why)"
                return f"stage {rank} (pid {proc.pid}) exited with code {proc.exitcode}: {detail}"
        return None

    def watch(self, on_dead) -> None:
        """Call on_dead(reason) from a daemon thread as soon as a stage process exits (it
        waits on the processes' sentinels, woken by close())."""
        if not self.procs:
            return
        stop_recv, self._stop = mp.Pipe(duplex=False)

        def run():
            ready = mp.connection.wait([p.sentinel for p in self.procs] + [stop_recv])
            if stop_recv not in ready:
                on_dead(self.dead_stage(wait_s=1.0) or "a stage process exited")
            stop_recv.close()

        threading.Thread(target=run, name="wavepp-watchdog", daemon=True).start()

    def unwatch(self) -> None:
        """Stop the watchdog (before stages exit on purpose). Safe to call twice."""
        if hasattr(self, "_stop"):
            try:
                self._stop.send(None)
            except OSError:  # the watchdog fired already and is gone
                pass
            self._stop.close()
            del self._stop

    def kill(self) -> None:
        """Kill the stage processes now: a pipeline in error cannot tell them to stop, and
        close() would wait for each to time out first."""
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(2)

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait for the stage processes to exit (kill them after `timeout_s`), leave the
        process group, and remove the run directory. Safe to call twice."""
        self.unwatch()
        for proc in self.procs:
            proc.join(timeout_s)
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(2)
        if self._unpinned is not None:
            pin_threads(self._unpinned)
            self._unpinned = None
        if hasattr(self, "channels"):
            self.channels.close()
        elif (
            getattr(self, "_joining", False) and dist.is_initialized()
        ):  # a rendezvous that failed half-way
            dist.destroy_process_group()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _worker_main(
    rank: int,
    world: int,
    backend: str,
    device: str,
    init: str,
    run_dir: str,
    cpus: tuple[int, ...] | None = None,
) -> None:
    _die_with_parent()
    if cpus is not None:  # before torch starts its thread pools: they inherit the mask
        os.sched_setaffinity(0, cpus)
    from wavepp.runtime.worker import run_worker

    try:
        channels = Channels(
            rank, world, backend, init_method=init, device=stage_device(device, rank)
        )
        run_worker(channels)
        channels.close()
    except BaseException as exc:
        Path(run_dir, f"stage{rank}.error").write_text(f"{type(exc).__name__}: {exc}")
        os._exit(1)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
