"""Starting the pipeline: a stage process that dies before the rendezvous fails the start at
once, with its reason, instead of leaving rank 0 waiting for the rendezvous timeout."""

import multiprocessing as mp
import os
import sys
import threading
import time

import pytest

from wavepp.runtime.launch import LocalCluster, StageStartError


def test_stage_dying_before_rendezvous_fails_the_start_fast(tmp_path):
    cluster = object.__new__(LocalCluster)
    cluster.run_dir = str(tmp_path)
    proc = mp.get_context("spawn").Process(target=sys.exit, args=(3,), daemon=True)
    proc.start()
    cluster.procs = [proc]
    never = threading.Event()
    t0 = time.perf_counter()
    with pytest.raises(StageStartError, match=r"stage 1 \(pid \d+\) exited with code 3"):
        cluster._rendezvous(never.wait, poll_s=0.05)  # the rendezvous itself never completes
    assert time.perf_counter() - t0 < 30


def test_rendezvous_result_and_errors_pass_through(tmp_path):
    cluster = object.__new__(LocalCluster)
    cluster.run_dir = str(tmp_path)
    cluster.procs = []
    assert cluster._rendezvous(lambda: "channels") == "channels"
    with pytest.raises(ValueError, match="bad init"):
        cluster._rendezvous(lambda: (_ for _ in ()).throw(ValueError("bad init")))


def test_stale_run_dirs_of_dead_owners_are_removed(tmp_path):
    import subprocess

    from wavepp.runtime.launch import RUN_DIR_PREFIX, remove_stale_run_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{RUN_DIR_PREFIX}{dead.pid}-abc"
    stale.mkdir()
    (stale / "stage1.error").write_text("x")
    live = tmp_path / f"{RUN_DIR_PREFIX}{os.getpid()}-def"
    live.mkdir()
    other = tmp_path / f"{RUN_DIR_PREFIX}notapid-ghi"
    other.mkdir()
    assert remove_stale_run_dirs(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and other.exists()


def test_stage_cpu_sets_split_the_cpus_in_equal_disjoint_sets():
    from wavepp.runtime.launch import stage_cpu_sets

    assert stage_cpu_sets(2, [1, 0]) == [(0,), (1,)]
    assert stage_cpu_sets(2, [0, 1, 2, 4, 5]) == [(0, 1), (2, 4)]  # the remainder (5) unused
    assert stage_cpu_sets(3, range(7)) == [(0, 1), (2, 3), (4, 5)]
    assert stage_cpu_sets(3, [0, 1]) is None  # two stages would share a core
    assert stage_cpu_sets(1, [3]) == [(3,)]


def _cpus_of(pid: int) -> set[int]:
    return os.sched_getaffinity(pid)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning two stages needs two CPUs")
def test_engine_pins_each_stage_to_its_own_cpus_and_restores_rank_0(tiny):
    from wavepp.engine import Engine
    from wavepp.runtime.launch import stage_cpu_sets

    before = os.sched_getaffinity(0)
    expected = stage_cpu_sets(2)
    with Engine(str(tiny), pp=2, dtype="float32", profile_waves=False) as engine:
        assert engine.stage_cpus == tuple(expected)
        assert _cpus_of(engine._cluster.procs[0].pid) == set(expected[1])
        # stage 0's compute thread keeps stage 0's CPUs; rank 0's other threads (the front
        # door, the rounds, the results) and the threads they start run on all of them
        (loop,) = engine._core.compute_thread_ids
        assert _cpus_of(loop) == set(expected[0])
        tids = [int(t) for t in os.listdir("/proc/self/task") if int(t) != loop]
        assert all(_cpus_of(t) == before for t in tids if os.path.exists(f"/proc/self/task/{t}"))
        started = []
        thread = threading.Thread(target=lambda: started.append(os.sched_getaffinity(0)))
        thread.start()
        thread.join()
        assert started == [before]
        assert engine.prefill([[1, 2, 3, 4, 5]])[0].error is None
    assert os.sched_getaffinity(0) == before
    with Engine(str(tiny), pp=2, dtype="float32", profile_waves=False, pin_cpus=False) as engine:
        assert engine.stage_cpus is None
        assert _cpus_of(engine._cluster.procs[0].pid) == before


def test_pinning_more_stages_than_cpus_is_refused_before_any_process_starts(tiny):
    from wavepp.engine import Engine

    pp = len(os.sched_getaffinity(0)) + 1
    children = set(mp.active_children())
    with pytest.raises(ValueError, match=rf"pin_cpus needs a CPU per stage: pp={pp}"):
        Engine(str(tiny), pp=pp, dtype="float32", profile_waves=False, pin_cpus=True)
    assert set(mp.active_children()) == children


def test_free_port_is_below_the_ephemeral_range_and_free(monkeypatch, tmp_path):
    """The port a stage's rendezvous binds seconds later is one no outgoing connection can be
    given meanwhile (the ephemeral range's), and nothing listens on it; with no room below the
    range the kernel's pick is used."""
    import socket

    from wavepp.runtime import launch

    low = int(launch._EPHEMERAL_RANGE.read_text().split()[0])
    ports = {launch.free_port() for _ in range(20)}
    assert all(launch._PORT_FLOOR <= p < low for p in ports)
    assert len(ports) > 1  # drawn, not one fixed port
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))
    # a port taken by a listener is never returned
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        fake = tmp_path / "range"
        fake.write_text(f"{launch._PORT_FLOOR + 10}\t60999\n")  # no room: the kernel picks
        monkeypatch.setattr(launch, "_EPHEMERAL_RANGE", fake)
        picked = {launch.free_port() for _ in range(5)}
        assert busy not in picked and all(p >= low for p in picked)  # from the kernel's range
