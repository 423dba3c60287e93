"""`wavepp bench --url`: the bench over HTTP against a real `wavepp serve` (tiny model, pp = 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.serve.conftest import ServerProcess, alive
from wavepp.bench.measure import Measurement
from wavepp.cli import main
from wavepp.runtime.launch import free_port

# short-suffix and reuse at a size the tiny model (512 positions) serves in about a second
WORKLOAD = [
    "--workload",
    "short-suffix,reuse",
    "--prefix-len",
    "64",
    "--suffix-len",
    "16",
    "--prompt-len",
    "96",
    "--num-groups",
    "2",
    "--concurrency",
    "4",
    "--num-requests",
    "24",
]


def _bench(tmp_path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["bench", *WORKLOAD, "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


def _ideal_hit_rates() -> dict[str, float]:
    from wavepp.workloads import WorkloadOptions, workload_from_options

    opts = WorkloadOptions(
        num_requests=24,
        prompt_len=96,
        prefix_len=64,
        suffix_len=16,
        num_groups=2,
        common={"vocab_size": 256, "block_size": 16},
    )
    return {
        wl.name: wl.ideal_hit_rate
        for wl in (workload_from_options(n, opts) for n in ("short-suffix", "reuse"))
    }


def test_bench_over_http_matches_in_process(server, tiny_model, tmp_path):
    http = _bench(tmp_path, "http", "--url", server.url, "--repeat", "2")
    local = _bench(
        tmp_path,
        "local",
        "--model",
        str(tiny_model),
        "--pp",
        "2",
        "--dtype",
        "float32",
        "--policy",
        "wavepp",
    )
    assert http["meta"]["caches_reset"] is True and http["meta"]["url"] == server.url
    assert http["meta"]["pp"] == 2 and http["meta"]["dtype"] == "float32"
    ideal = _ideal_hit_rates()
    local_hit = {r["workload"]: r["hit_rate"] for r in local["rows"]}
    assert len(http["rows"]) == 4  # 2 workloads x 2 repeats
    for row in http["rows"]:
        assert set(row) == set(local["rows"][0]) == set(Measurement.__dataclass_fields__)
        assert row["policy"] == "wavepp" and row["pp"] == 2
        assert row["num_requests"] == 24 and row["num_failed"] == 0
        # every run starts from empty caches (POST /debug/reset): the same reuse as in-process
        assert row["hit_rate"] == pytest.approx(ideal[row["workload"]], abs=1e-12)
        assert row["hit_rate"] == pytest.approx(local_hit[row["workload"]], abs=1e-12)
        assert row["input_tokens"] == next(
            r["input_tokens"] for r in local["rows"] if r["workload"] == row["workload"]
        )
        # per-stage figures come from /metrics
        assert len(row["stage_utilization"]) == 2 and all(
            0 < u <= 1 for u in row["stage_utilization"]
        )
        assert row["admission_p50_ms"] is not None and row["num_waves"] > 0
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p95_ms"]
    assert set(http["meta"]["medians"][0]) == set(local["meta"]["medians"][0])


def test_bench_url_refuses_what_http_cannot_change(server, capsys):
    assert main(["bench", "--url", server.url, "--policy", "lockstep"]) == 2
    assert "cannot be switched over HTTP" in capsys.readouterr().err
    assert main(["bench", "--url", server.url, "--pp", "3"]) == 2
    assert "--pp 2, not 3" in capsys.readouterr().err
    assert main(["bench", "--url", server.url, "--stage-num-blocks", "40,64"]) == 2
    assert "--stage-num-blocks is not available with --url" in capsys.readouterr().err


def test_bench_bad_url_fails_fast():
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "wavepp.cli", "bench", "--url", f"http://127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    assert "cannot reach a server" in p.stderr
    assert time.monotonic() - t0 < 30


@pytest.fixture(scope="module")
def plain_server(tiny_model, tmp_path_factory):
    """A server started without --debug: no /debug/reset. It is killed (SIGKILL) below, so its
    run directory goes under pytest's tmp_path."""
    srv = ServerProcess(
        tiny_model, debug=False, env={"TMPDIR": str(tmp_path_factory.mktemp("plain"))}
    )
    yield srv
    for pid in [srv.proc.pid, *srv.stage_pids]:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    srv.proc.wait(10)


def test_bench_without_reset_says_so(plain_server, tmp_path):
    out = _bench(
        tmp_path, "plain", "--url", plain_server.url, "--repeat", "2", "--workload", "reuse"
    )
    assert out["meta"]["caches_reset"] is False
    ideal = _ideal_hit_rates()["reuse"]
    second = [r for r in out["rows"] if r["repeat"] == 1]
    # the second run finds the first one's prefixes cached: more reuse than the workload holds
    assert second and second[0]["hit_rate"] > ideal + 0.05


def test_bench_fails_when_the_server_dies_mid_run(plain_server, tmp_path):
    def num_ok() -> float:
        text = httpx.get(f"{plain_server.url}/metrics", timeout=10).text
        return next(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith('wavepp_requests_total{outcome="ok"}')
        )

    start = num_ok()
    bench = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wavepp.cli",
            "bench",
            "--url",
            plain_server.url,
            "--workload",
            "reuse",
            "--prompt-len",
            "96",
            "--concurrency",
            "8",
            "--num-requests",
            "2000",
            "--timeout-s",
            "20",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while num_ok() < start + 30:  # the bench is under way
            assert bench.poll() is None, bench.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        for pid in [plain_server.proc.pid, *plain_server.stage_pids]:
            os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        _, err = bench.communicate(timeout=30)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode != 0
    assert "wavepp bench: error:" in err and "requests not answered" in err, err
    assert time.monotonic() - t_kill < 25
