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
        cluster._rendezvous(never.wait, poll_s=0.05)   # the rendezvous itself never completes
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
