"""An Engine's options: one frozen record, checked once where it is built.

    config = EngineConfig("smollm2", pp=2, kv_store="/dev/shm/kv")   # a bad option raises here
    engine = Engine(config)            # or Engine("smollm2", pp=2, ...), which builds the same

The command line and the server build it from their flags; the engine turns it into the
`RuntimeConfig` every rank receives (runtime/config.py) once the model's path, the device and
the run directory are known. Every check runs before a process is spawned or a model is
converted: the engine-only options here, the options every rank shares by building their
RuntimeConfig (whose checks are the one place they are written).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from wavepp.kv_transfer.mooncake.engine import check_host
from wavepp.kv_transfer.transports import TRANSPORTS
from wavepp.model_store import DEFAULT_MODEL
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.device import DEVICES


@dataclass(frozen=True)
class EngineConfig:
    """`pp` stage processes for `model`. `stage_num_blocks` sets each stage's cache size in
    blocks (stages may differ); else each stage gets `kv_cache_gib` of KV blocks, or by default
    room for 32 full-length prompts within 1 GiB and a quarter of the available memory. A
    hybrid model (Kimi-Linear) saves state snapshots every `snapshot_interval_blocks` blocks
    (default: from memory, `models.stage_pool`), and its planner moves chunk ends onto that grid
    when one is within `snapshot_align_frac` of the chunk (0: never; `PlannerConfig`).
    `profile_waves`: time waves of varied shape on every stage at start-up and start the
    planner's cost model from their fit (runtime/profile.py).

    `device`: "cpu", "cuda" (stage i on its own GPU, cuda:LOCAL_RANK under torchrun) or "auto"
    (cuda when there is one). `backend`: the data plane's, for activations between stages
    (None: nccl when every stage has a GPU of its own, else gloo; runtime/device.py).

    `kv_store`: a directory where every stage writes its layers' KV of the requests submitted
    with `kv_transfer`, for a decode engine to load (kv_transfer/); transfers live until taken,
    `kv_ttl_s` passed or the store passes `kv_store_max_gib` (oldest first; default: half the
    file system's free space at start, kv_transfer/handoff.py), and those the engine wrote are
    removed at its shutdown. An answer waits at most `kv_export_wait_s` after the prefill for
    the stages' parts (then names them failed). `kv_transport="mooncake"` hands the KV on
    over Mooncake's transfer engine instead (no directory): each stage keeps its parts in an
    arena of `kv_arena_gib` registered with an engine of its own on `kv_host`, over
    `kv_transport_protocol` ("tcp" or "rdma"), until the decode side pulled them, `kv_ttl_s`
    passed or newer parts needed the room (kv_transfer/mooncake/).

    `layer_split`: each stage's number of layers, in order (default: balanced; rank 0 also runs
    the leader: the README's "Against the peers"). `pin_cpus`: each stage's process on CPUs of
    its own (runtime/launch.py `pinned_cpu_sets`; default: on the CPU where there is one per
    stage)."""

    model: str = DEFAULT_MODEL  # a built-in name or an HF-format directory
    pp: int = 2
    policy: str = "wavepp"
    dtype: str = "bfloat16"
    block_size: int = 16
    stage_num_blocks: tuple[int, ...] = ()  # one per stage; empty: from kv_cache_gib or memory
    kv_cache_gib: float | None = None
    top_k: int = 5
    num_threads: int = 1
    backend: str | None = None  # None: nccl when every stage has its own GPU, else gloo
    snapshot_interval_blocks: int | None = None
    snapshot_align_frac: float = 0.125
    profile_waves: bool = True
    device: str = "cpu"  # "cpu" | "cuda" | "auto"
    kv_store: str | None = None  # the KV hand-off's directory; None: no hand-off
    kv_transport: str | None = None  # "directory" | "mooncake"; None: "directory" with kv_store
    kv_transport_protocol: str = "tcp"  # mooncake: "tcp" | "rdma"
    kv_host: str | None = None  # mooncake: the stages' address (None: the default route's)
    kv_arena_gib: float = 2.0  # mooncake: each stage's staging arena
    kv_store_max_gib: float | None = None  # None: half the store's file system's free space
    kv_ttl_s: float = 600.0
    kv_export_wait_s: float = 60.0
    layer_split: tuple[int, ...] = ()  # layers per stage; empty: balanced
    pin_cpus: bool | None = None  # None: pinned on the CPU where there is a CPU per stage

    def __post_init__(self) -> None:
        for name in ("stage_num_blocks", "layer_split"):  # any sequence (or None) -> a tuple
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        if isinstance(self.model, Path):
            object.__setattr__(self, "model", str(self.model))
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a built-in name or a directory, got {self.model!r}")
        if self.kv_store_max_gib is not None and not self.kv_store_max_gib > 0:
            raise ValueError(f"kv_store_max_gib must be positive, got {self.kv_store_max_gib}")
        if not self.kv_ttl_s > 0:
            raise ValueError(f"kv_ttl_s must be positive, got {self.kv_ttl_s}")
        if self.kv_store is not None and not str(self.kv_store):
            raise ValueError("kv_store must name a directory")
        transport = TRANSPORTS.get(self.kv_transport)  # an unknown name: RuntimeConfig says so
        if transport is not None and transport.needs_store and self.kv_store is None:
            raise ValueError(f"kv_transport={transport.name!r} needs kv_store (a directory)")
        if transport is not None and not transport.needs_store and self.kv_store is not None:
            raise ValueError(
                f"kv_store is the directory transport's; kv_transport={transport.name!r} takes none"
            )
        if transport is not None and transport.takes_host and self.kv_host:
            check_host(self.kv_host)  # an address this machine resolves, or ValueError
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        # the options every rank shares
        self.runtime_config("", "cpu", self.backend or "gloo", kv_store=self.kv_store or "")

    @property
    def handoff_transport(self) -> str:
        """ "" (no hand-off), "directory" or "mooncake"."""
        if self.kv_transport is not None:
            return self.kv_transport
        return "directory" if self.kv_store is not None else ""

    def runtime_config(
        self, model_path: str, device: str, backend: str, *, kv_store: str = "", run_dir: str = ""
    ) -> RuntimeConfig:
        """What every rank receives, for the resolved model path, device and backend."""
        return RuntimeConfig(
            model_path=model_path,
            num_stages=self.pp,
            policy=self.policy,
            dtype=self.dtype,
            block_size=self.block_size,
            stage_num_blocks=self.stage_num_blocks,
            kv_cache_gib=self.kv_cache_gib,
            top_k=self.top_k,
            num_threads=self.num_threads,
            backend=backend,
            device=device,
            run_dir=run_dir,
            snapshot_interval_blocks=self.snapshot_interval_blocks,
            snapshot_align_frac=self.snapshot_align_frac,
            profile_waves=self.profile_waves,
            kv_store=kv_store,
            kv_transport=self.handoff_transport,
            kv_transport_protocol=self.kv_transport_protocol,
            kv_host=self.kv_host or "",
            kv_arena_gib=self.kv_arena_gib,
            kv_ttl_s=self.kv_ttl_s,
            kv_export_wait_s=self.kv_export_wait_s,
            layer_split=self.layer_split,
        )

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)
