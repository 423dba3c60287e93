"""The device setting: resolved and checked on rank 0 before any stage process starts.

CUDA itself is exercised in tests/gpu/ (skipped without a GPU); here the choices that do not
need one: names, backends, GPU numbering (with the device count stubbed), and the Engine's
refusal to start on a device it cannot use.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist

import wavepp.engine
from wavepp.engine import Engine
from wavepp.engine_config import EngineConfig
from wavepp.runtime import device as dev
from wavepp.runtime.config import RuntimeConfig

from .test_e2e import check, reference, workload

NO_CUDA = not torch.cuda.is_available()


def test_auto_resolves_to_what_torch_sees():
    assert dev.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert dev.resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="device must be one of cpu, cuda, auto, got 'gpu'"):
        dev.resolve_device("gpu")


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is there")
def test_cuda_without_cuda_is_refused_naming_why():
    with pytest.raises(
        ValueError, match="device='cuda' asked for, but this torch .* use device='cpu'"
    ):
        dev.resolve_device("cuda")


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is there")
def test_engine_on_cuda_without_cuda_fails_before_spawning(tiny, monkeypatch):
    def no_cluster(*args, **kwargs):
        raise AssertionError("a stage process was about to start")

    monkeypatch.setattr(wavepp.engine, "LocalCluster", no_cluster)
    with pytest.raises(ValueError, match="device='cuda' asked for"):
        Engine(str(tiny), pp=2, device="cuda")
    assert mp.active_children() == [] and not dist.is_initialized()


def test_nccl_needs_cuda_and_a_gpu_per_stage(monkeypatch):
    with pytest.raises(ValueError, match="backend='nccl' moves CUDA tensors only"):
        dev.check_backend("cpu", "nccl", 2)
    with pytest.raises(ValueError, match="backend must be 'gloo' or 'nccl'"):
        dev.check_backend("cpu", "mpi", 2)
    dev.check_backend("cpu", "nccl", 1)  # one stage: no data plane at all
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="2 stage processes on this machine, 1 CUDA device"):
        dev.check_backend("cuda", "nccl", 2)
    assert dev.default_backend("cuda", 2) == "gloo"  # two stages share the GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    dev.check_backend("cuda", "nccl", 2)
    assert dev.default_backend("cuda", 2) == "nccl"
    assert dev.default_backend("cuda", 3) == "gloo"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # torchrun, one stage per node
    assert dev.default_backend("cuda", 3) == "nccl"
    assert dev.default_backend("cpu", 3) == "gloo"


def test_stages_take_gpus_round_robin(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [dev.stage_device("cuda", r) for r in range(4)] == [
        torch.device("cuda", i) for i in (0, 1, 0, 1)
    ]
    assert dev.stage_device("cpu", 3) == torch.device("cpu")


def test_config_holds_a_resolved_device():
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda' here"):
        RuntimeConfig(EngineConfig(pp=1), model_path="", device="auto")


def test_engine_on_auto_matches_transformers(tiny):
    prompts = workload(seed=11)[:6]
    with Engine(str(tiny), pp=2, dtype="float32", device="auto" if NO_CUDA else "cpu") as engine:
        assert engine.runtime_config.device == "cpu" and engine.runtime_config.backend == "gloo"
        assert engine._core.stage.device == torch.device("cpu")
        check(engine.prefill(prompts), reference(tiny, prompts), tol=1e-3)
