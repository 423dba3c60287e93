"""Processes and channels: stage ranks over torch.distributed, WAVE and LOOP per rank."""

from wavepp.runtime.channels import Channels, PeerLostError
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.core import EngineCore, EngineError
from wavepp.runtime.launch import LocalCluster, torchrun_rank
from wavepp.runtime.worker import run_worker

__all__ = [
    "Channels",
    "PeerLostError",
    "RuntimeConfig",
    "EngineCore",
    "EngineError",
    "LocalCluster",
    "torchrun_rank",
    "run_worker",
]
