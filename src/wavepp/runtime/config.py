"""What every rank needs to build its stage: a frozen, picklable record.

It carries the engine's options whole (`engine`, an EngineConfig, checked where it was built)
and adds only what a started engine knows: the model's resolved path, the resolved device and
data-plane backend, the run directory, the directory store's root, the layer split chosen
(runtime/stage_split.py: "auto" is measured once, on rank 0, so every stage builds the same) and
the pools' sizes (runtime/stage_blocks.py: computed once, on rank 0, for the same reason).
"""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.engine_config import EngineConfig


@dataclass(frozen=True)
class RuntimeConfig:
    engine: EngineConfig
    model_path: str  # the model's directory, resolved (model_store.py)
    device: str = "cpu"  # "cpu" | "cuda", resolved from engine.device (runtime/device.py)
    backend: str = "gloo"  # the data plane's (activations), resolved; objects go over gloo
    run_dir: str = ""  # where stage processes leave error reports
    kv_store: str | None = None  # the directory store's root, resolved; None without one
    layer_split: tuple[int, ...] = ()  # layers per stage as chosen; (): engine's counts or even
    stage_blocks: tuple[int, ...] = ()  # blocks per stage as sized on rank 0 (stage_blocks.py)

    def __post_init__(self) -> None:
        given = self.engine.layer_split
        if not self.layer_split and isinstance(given, tuple):
            object.__setattr__(self, "layer_split", given)
        object.__setattr__(self, "layer_split", tuple(self.layer_split))
        object.__setattr__(self, "stage_blocks", tuple(self.stage_blocks))
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda' here (resolved), got {self.device!r}")
