"""Starting and stopping: a failed start leaves no stage process, process group or run
directory behind, and the next Engine in the same process works; shutdown resolves every
future; a killed stage never makes the interpreter abort at exit.

No engine is alive between these tests (the checks look at the whole process).
"""

import multiprocessing as mp
import os
import random
import re
import subprocess
import sys
import textwrap
import time
from concurrent.futures import wait

import pytest
import torch.distributed as dist

from wavepp.engine import Engine, EngineError
from wavepp.runtime.launch import StageStartError

from .helpers import MAX_POSITIONS, VOCAB, assert_clean, groups


def _no_stage_left():
    assert not [p for p in mp.active_children() if p.name.startswith("wavepp-stage")]
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"dtype": "float16"}, ValueError, "dtype must be"),
        (
            {"pp": 0},
            ValueError,
            "pp \\(the number of pipeline stages\\) must be a positive integer",
        ),
        ({"pp": 9}, ValueError, "cannot split 4 layers into 9 stages"),
        ({"policy": "fastest"}, ValueError, "unknown policy 'fastest'"),
        ({"stage_num_blocks": [8]}, ValueError, "stage_num_blocks has 1 entries for 2 stages"),
    ],
)
def test_failed_start_leaves_nothing_and_the_next_engine_works(tiny, kwargs, error, message):
    args = dict(pp=2, dtype="float32") | kwargs
    with pytest.raises(error, match=message):
        Engine(str(tiny), **args)
    _no_stage_left()


def test_stage_that_fails_to_load_then_a_working_engine(tiny, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    # stage 1's layers are missing from the checkpoint: stage 0 loads, stage 1 fails
    from safetensors.torch import load_file, save_file

    weights = load_file(broken / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if "layers.3." not in k}, broken / "model.safetensors"
    )
    with pytest.raises((EngineError, StageStartError), match="stage 1"):
        Engine(str(broken), pp=2, dtype="float32")
    _no_stage_left()
    with Engine(str(tiny), pp=2, dtype="float32") as eng:
        assert eng.submit([1, 2, 3]).result(timeout=30).ok
        run_dir = eng._cluster.run_dir
        assert os.path.isdir(run_dir)
    assert not os.path.exists(run_dir)  # no run directory left behind
    _no_stage_left()


def test_shutdown_with_work_in_flight_resolves_every_future(tiny):
    eng = Engine(str(tiny), pp=2, dtype="float32")
    rng = random.Random(3)
    futures = [eng.submit([rng.randrange(VOCAB) for _ in range(300)]) for _ in range(32)]
    t0 = time.monotonic()
    eng.shutdown()
    done, pending = wait(futures, timeout=5)
    assert not pending and time.monotonic() - t0 < 15
    for f in futures:  # finished before the shutdown, or failed by it
        assert f.exception() is None or "shut down" in str(f.exception())
    with pytest.raises(EngineError, match="shut down"):
        eng.submit([1, 2, 3])
    with pytest.raises(EngineError, match="shut down"):
        eng.check_integrity()
    eng.shutdown()  # twice is fine
    assert not os.path.exists(eng._cluster.run_dir)
    _no_stage_left()


KILLED_STAGE_SCRIPT = textwrap.dedent("""
    import os, random, signal, sys
    from wavepp.engine import Engine, EngineError
    if __name__ == "__main__":
        with Engine(sys.argv[1], pp=2, dtype="float32") as engine:
            futures = [engine.submit([random.randrange(256) for _ in range(300)]) for _ in range(20)]
            os.kill(engine._cluster.procs[-1].pid, signal.SIGKILL)
            try:
                for f in futures:
                    f.result(timeout=20)
            except EngineError as exc:
                print("engine error:", exc)
""")


def test_exit_code_zero_after_a_killed_stage(tiny, tmp_path):
    """Leaving the `with` block after a stage died joins every thread: the interpreter exits
    cleanly (it used to abort with 'terminate called without an active exception')."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED_STAGE_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    for _batch in range(3):  # two at a time
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(tiny)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err[-2000:]
            assert "engine error: stage" in out
    assert not list(tmp_path.glob("wavepp-*"))


@pytest.mark.parametrize("policy", ["wavepp", "lockstep"])
def test_randomized_mix_every_future_resolves(tiny, policy):
    """Submit, abort, duplicate ids, over-long and too-large prompts on tight, unequal caches:
    every future resolves within the bound with a result or a known reason, the caches check
    out, and the engine still serves."""
    rng = random.Random(11)
    prefixes = groups(rng, num_groups=4, prefix_len=64)
    expected_errors = re.compile(
        r"aborted$|the prompt needs \d+ blocks of 16 tokens; the smallest stage "
        r"holds 24$|the prompt has \d+ tokens; the model takes at most 512 "
    )
    with Engine(str(tiny), pp=2, dtype="float32", policy=policy, stage_num_blocks=[24, 40]) as eng:
        futures, refused = [], 0
        for _ in range(250):
            kind = rng.random()
            if kind < 0.6:
                prompt = rng.choice(prefixes) + [
                    rng.randrange(VOCAB) for _ in range(rng.randrange(1, 80))
                ]
            elif kind < 0.7:  # more blocks than stage 0 holds
                prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(385, MAX_POSITIONS))]
            elif kind < 0.75:  # past the model's positions
                prompt = [rng.randrange(VOCAB) for _ in range(MAX_POSITIONS + rng.randrange(1, 50))]
            else:
                prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 200))]
            try:
                futures.append(
                    eng.submit(prompt, request_id=rng.choice([None, None, rng.randrange(40)]))
                )
            except ValueError as exc:  # an id still in use
                assert "already in use" in str(exc)
                refused += 1
            if rng.random() < 0.3:
                eng.abort(rng.choice(futures).request_id)
        done, pending = wait(futures, timeout=120)
        assert not pending, f"{len(pending)} futures never resolved"
        results = [f.result() for f in futures]
        assert refused > 0 and sum(r.ok for r in results) > len(results) // 3
        assert sum(r.error == "aborted" for r in results) > 10
        for r in results:
            assert r.ok or expected_errors.match(r.error), r.error
        assert_clean(eng)
        assert eng.submit(prefixes[0] + [1, 2]).result(timeout=30).ok
