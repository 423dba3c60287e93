"""`wavepp serve` under torchrun, two "nodes" on loopback: rank 0 serves HTTP, rank 1 serves
its stage; answers equal transformers'; SIGTERM to rank 0's torchrun stops both nodes."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.serve.conftest import hf_logprobs
from wavepp.runtime.launch import free_port

pytestmark = pytest.mark.slow


def test_serve_two_nodes_under_torchrun(tiny_model):
    master, http = str(free_port()), free_port()
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        master,
    ]
    cmd = [
        "-m",
        "wavepp.cli",
        "serve",
        "--model",
        str(tiny_model),
        "--pp",
        "2",
        "--dtype",
        "float32",
        "--port",
        str(http),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    nodes = [
        subprocess.Popen(
            torchrun + ["--node-rank", str(rank)] + cmd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (1, 0)
    ]
    try:
        url = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert all(n.poll() is None for n in nodes), nodes[1].stderr.read()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.3)
        ids = list(range(3, 60))
        r = httpx.post(f"{url}/v1/completions", json={"prompt": ids, "logprobs": 1}, timeout=60)
        assert r.status_code == 200, r.text
        lp = r.json()["choices"][0]["logprobs"]["token_logprobs"][0]
        assert math.isclose(lp, float(hf_logprobs(tiny_model, ids)[-1].max()), abs_tol=1e-4)
        nodes[1].send_signal(signal.SIGTERM)  # rank 0's torchrun
        for n in nodes:
            n.wait(timeout=60)
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
