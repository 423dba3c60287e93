"""The processes of the disaggregation tests: vLLM's OpenAI server (its CPU build, in `.venv-vllm`)
with the WavePPConnector, `wavepp route`, and what the tests do to a transfer (in the store, or in
a stage's arena over the transfer engine)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save

from wavepp.bench.http import wait_until_healthy
from wavepp.kv_transfer.directory import DirectoryStore, Transfer, TransferError
from wavepp.kv_transfer.mooncake.engine import TransferEngineHandle
from wavepp.kv_transfer.mooncake.part import DTYPES
from wavepp.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="no vLLM venv (.venv-vllm): `make test` makes it"
)


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **env}
    )


def start_vllm(
    model: str,
    store: Path | None,
    log: Path,
    *args: str,
    env: dict | None = None,
    eager: bool = True,
    extra: dict | None = None,
) -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server on `model` with the connector (reading `store` too, when given; no
    prefix caching: a cached token is one the connector loaded); `args` are more of its
    options, `env` more of its environment, `extra` more of the connector's extra config.
    `eager`: --enforce-eager, no torch.compile at start-up (40-60 s on a 2-core CPU; both sides
    of a test's comparison run in this one server)."""
    port = free_port()
    cmd, vllm_env = vllm_command(
        model,
        port,
        ({} if store is None else {"store": str(store)}) | (extra or {}),
        *args,
        env=env,
        eager=eager,
    )
    return start(cmd, vllm_env, log), f"http://127.0.0.1:{port}"


def vllm_command(
    model: str,
    port: int,
    extra: dict,
    *args: str,
    env: dict | None = None,
    eager: bool = True,
    host: str = "127.0.0.1",
) -> tuple[list[str], dict]:
    """(command, environment) of vLLM's OpenAI server with the connector (its
    `kv_connector_extra_config`: `extra`) on `host`:`port`; see start_vllm."""
    config = {
        "kv_connector": "WavePPConnector",
        "kv_connector_module_path": "wavepp.connectors.vllm",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": extra,
    }
    return (
        [
            str(VLLM_PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--host",
            host,
            "--port",
            str(port),
            "--no-enable-prefix-caching",
            "--enable-prompt-tokens-details",
            *(["--enforce-eager"] if eager else []),
            "--kv-transfer-config",
            json.dumps(config),
            *args,
        ],
        {
            "PYTHONPATH": str(ROOT / "src"),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_CPU_OMP_THREADS_BIND": "0-1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            **(env or {}),
        },
    )


def start_route(prefill_url: str, decode_url: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = start(
        [
            sys.executable,
            "-m",
            "wavepp.cli",
            "route",
            "--prefill",
            prefill_url,
            "--decode",
            decode_url,
            "--port",
            str(port),
        ],
        {},
        log,
    )
    return proc, f"http://127.0.0.1:{port}"


def grouped_prompts(seed: int = 5) -> list[list[int]]:
    """16 prompts of token ids in four groups sharing 150-token prefixes, 160 to 205 tokens."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(100, 40000) for _ in range(150)] for _ in range(4)]
    return [
        prefixes[i % 4] + [rng.randrange(100, 40000) for _ in range(10 + 3 * i)] for i in range(16)
    ]


# the prefill servers skip the start-up profiling pass (about 15 s for SmolLM2): their
# throughput is not what these tests check
NO_PROFILE = ("--no-profile-waves",)

# `wavepp serve` options of the transfer engine's hand-off, on loopback, with a small arena
MOONCAKE_PREFILL = (
    *NO_PROFILE,
    "--kv-transport",
    "mooncake",
    "--kv-host",
    "127.0.0.1",
    "--kv-arena-gib",
    "0.25",
)


def start_decode_and_route(
    model: str,
    store: Path | None,
    prefill_url: str,
    tmp_path: Path,
    *vllm_args: str,
    env: dict | None = None,
    eager: bool = True,
) -> tuple[list[subprocess.Popen], str, str]:
    """vLLM with the connector (start_vllm) and `wavepp route` in front of it and the prefill
    server, both healthy (their logs: tmp_path / vllm.log, route.log). -> (processes, vLLM's url,
    the router's url); the caller stops the processes."""
    vllm, vllm_url = start_vllm(
        model, store, tmp_path / "vllm.log", *vllm_args, env=env, eager=eager
    )
    procs = [vllm]
    try:
        route, route_url = start_route(prefill_url, vllm_url, tmp_path / "route.log")
        procs.append(route)
        wait_healthy(
            [(vllm, vllm_url, tmp_path / "vllm.log"), (route, route_url, tmp_path / "route.log")]
        )
    except BaseException:
        stop(procs)
        raise
    return procs, vllm_url, route_url


def wait_healthy(procs: list[tuple[subprocess.Popen, str, Path]], timeout_s: float = 900) -> None:
    """Each (process, url, log) answers /health; else RuntimeError with the end of its log."""
    for proc, url, log in procs:
        try:
            wait_until_healthy(url, proc, timeout_s=timeout_s)
        except RuntimeError as err:
            raise RuntimeError(f"{err}\n{log.read_text()[-4000:]}") from None


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_for_transfer(store: DirectoryStore, transfer_id: str, timeout_s: float = 30) -> Transfer:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return store.read(transfer_id)
        except TransferError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def poison(store: DirectoryStore, transfer_id: str, pools: tuple[str, ...] = ("value",)) -> None:
    """Replace every stage's rows of `pools` with noise, the files well formed and their checksums
    right: only the decode's output can tell."""
    gen = torch.Generator().manual_seed(0)
    for part in store.read(transfer_id).parts:
        tensors = load_file(str(part.path))
        for pool in pools:
            tensors[pool] = (
                torch.randn(tensors[pool].shape, generator=gen, dtype=tensors[pool].dtype) * 4
            )
        manifest = {
            k: v
            for k, v in part.manifest.items()
            if k not in ("stage_id", "file", "bytes", "sha256")
        }
        store.write_part(transfer_id, part.stage_id, save(tensors), manifest)


def stage_gauge(metrics: str, name: str) -> dict[str, float]:
    """{stage: value} of a per-stage gauge (wavepp_kv_arena_*, wavepp_kv_tier_store_reachable)
    in /metrics text."""
    out = {}
    for line in metrics.splitlines():
        if line.startswith(name + "{"):
            stage = line.split('stage="', 1)[1].split('"', 1)[0]
            out[stage] = float(line.rsplit(" ", 1)[1])
    return out


def poison_part(location: dict, engine: TransferEngineHandle, pool_name: str) -> None:
    """Noise over a stage's `pool_name` rows, written into its arena over the network: only
    the decode's output can tell."""
    pool = location["pools"][pool_name]
    n = len(pool["layers"]) * location["num_tokens"] * pool["width"]
    noise = (torch.randn(n, generator=torch.Generator().manual_seed(0)) * 4).to(
        DTYPES[location["dtype"]]
    )
    raw = noise.view(torch.uint8).clone()
    engine.register(raw)
    engine.write(
        location["session"], raw.data_ptr(), location["addr"] + pool["offset"], raw.numel()
    )


def arenas_empty(client, prefill_url: str, num_stages: int) -> bool:
    """Every stage's arena holds nothing, by the prefill's /metrics."""
    metrics = client.get(f"{prefill_url}/metrics").text
    empty = {str(stage): 0 for stage in range(num_stages)}
    return (
        stage_gauge(metrics, "wavepp_kv_arena_transfers") == empty
        and stage_gauge(metrics, "wavepp_kv_arena_bytes") == empty
    )


def loaded_tokens(metrics: str) -> float:
    """vLLM's count of prompt tokens loaded from outside, from its /metrics text."""
    lines = [
        line
        for line in metrics.splitlines()
        if line.startswith("vllm:prompt_tokens_by_source_total") and "external_kv_transfer" in line
    ]
    assert lines, (
        'vLLM\'s /metrics has no vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}'
    )
    return float(lines[0].rsplit(" ", 1)[1])


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of `name` with `labels` (among others) in /metrics text; 0 if absent."""
    for line in metrics.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def pull_counts(client, url: str) -> tuple[float, float]:
    """vLLM's count of the connector's pulls: (ok, failed)."""
    metrics = client.get(f"{url}/metrics").text
    return tuple(sample(metrics, "vllm:wavepp_kv_pulls_total", status=s) for s in ("ok", "failed"))
