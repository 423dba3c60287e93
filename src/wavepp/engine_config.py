"""An Engine's options: one frozen record, checked once where it is built.

    config = EngineConfig("smollm2", pp=2, kv_store="/dev/shm/kv")   # a bad option raises here
    engine = Engine(config)            # or Engine("smollm2", pp=2, ...), which builds the same

The command line and the server build it from their flags (their defaults are this record's,
cli/args.py); every rank receives it inside a `RuntimeConfig` (runtime/config.py), beside what
only a started engine knows (the model's path, the resolved device and backend, the run
directory). Every check is written here, once, and runs before a process is spawned or a model
is converted; each error names the option.

Torch-free: the command line reads the defaults without loading torch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from wavepp.kv_events.config import KVEventsConfig
from wavepp.kv_transfer.mooncake.engine import check_host
from wavepp.kv_transfer.transports import TRANSPORTS, transport_names
from wavepp.model_store import DEFAULT_MODEL
from wavepp.models.spec.layer_split import SPLIT_SETTINGS
from wavepp.sched.policy import get_policy

DEVICES = ("cpu", "cuda", "auto")  # a setting; runtime/device.py resolves it
BACKENDS = ("gloo", "nccl")
DTYPES = ("bfloat16", "float32")
KV_PROTOCOLS = ("tcp", "rdma")  # the Mooncake transfer engines' protocols
KV_TIERS = ("mooncake-store",)  # the shared KV tiers (runtime/mooncake_store.py)


@dataclass(frozen=True)
class EngineConfig:
    """`pp` stage processes for `model`. `stage_num_blocks` sets each stage's cache size in
    blocks (stages may differ); else every stage gets the same count, the most that fits each
    stage's `kv_cache_gib` (by default 1 GiB and a quarter of the available memory, and at most
    32 full-length prompts) with its own layers' bytes (runtime/stage_blocks.py). A
    hybrid model (Kimi-Linear) saves state snapshots every `snapshot_interval_blocks` blocks
    (default: from memory, `models.stage_pool`), and its planner moves chunk ends onto that grid
    when one is within `snapshot_align_frac` of the chunk (0: never; `PlannerConfig`).
    `profile_waves`: time waves of varied shape on every stage at start-up and start the
    planner's cost model from their fit (runtime/profile.py). `host_kv_gib`: each stage keeps
    the blocks its pool evicts in that much host memory, for a later request to load back
    instead of computing them (cache/host_tier.py, runtime/host_kv.py; 0: no tier; a hybrid
    model's recurrent-state snapshots go with them). `kv_tier=
    "mooncake-store"`: every stage also puts each full block it computes into Mooncake Store
    (its master at `kv_tier_master`, HOST:PORT; its metadata server at `kv_tier_metadata`,
    default the master's on port 8080), lending it `kv_tier_segment_gib` of memory, and reuses
    what any replica with the same model, layer split and dtype put there, a hybrid model's
    state snapshots too (cache/store_tier.py, runtime/store_kv.py); a lookup unanswered for
    `kv_tier_timeout_s` counts the store down for a while (runtime/mooncake_store.py).

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
    passed or newer parts needed the room (kv_transfer/mooncake/); a transfer of those engines
    (rank 0's release writes) that makes no progress for `kv_transfer_timeout_s` fails.

    `kv_events`: rank 0 publishes the blocks every stage holds as vLLM's KV cache events, over
    ZeroMQ, for a KV-aware router (kv_events/, vLLM's option of the same name).

    `layer_split`: each stage's number of layers, in order (rank 0 also runs the leader: the
    README's "Against the peers"); "even", the count split (sizes differing by at most one);
    "auto", the split whose slowest stage is the fastest, from each layer's cost measured at
    start-up (or the cost model's: runtime/stage_split.py). Default: "auto" where the model's
    layers differ, else "even". `pin_cpus`: each stage's process on CPUs of
    its own (runtime/launch.py `pinned_cpu_sets`; default: on the CPU where there is one per
    stage)."""

    model: str = DEFAULT_MODEL  # a built-in name or an HF-format directory
    pp: int = 2
    policy: str = "wavepp"
    scheduling_policy: str = "fcfs"  # "fcfs" | "priority": the order of admission and packing
    priority_aging_s: float = 10.0  # priority: a waiting request gains one level this often
    dtype: str = "bfloat16"  # "bfloat16" | "float32"
    block_size: int = 16
    stage_num_blocks: tuple[int, ...] = ()  # one per stage; empty: from kv_cache_gib or memory
    kv_cache_gib: float | None = None
    host_kv_gib: float = 0.0  # each stage's host KV tier (evicted blocks, loaded back); 0: none
    kv_tier: str | None = None  # "mooncake-store": a KV tier every replica shares; None: none
    kv_tier_master: str | None = None  # its master's HOST:PORT
    kv_tier_metadata: str | None = None  # its metadata server (None: the master's, port 8080)
    kv_tier_segment_gib: float = 1.0  # the memory each stage lends to the shared store
    kv_tier_timeout_s: float = 5.0  # a store lookup unanswered this long: the store counts down
    top_k: int = 5  # logprobs returned per first token
    num_threads: int = 1  # compute threads per stage process
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
    kv_transfer_timeout_s: float = 10.0  # mooncake: a transfer with no progress this long fails
    layer_split: tuple[int, ...] | str = ()  # counts | "auto" | "even"; (): auto if layers differ
    pin_cpus: bool | None = None  # None: pinned on the CPU where there is a CPU per stage
    kv_events: KVEventsConfig | None = None  # KV cache events for routers; None: none

    @property
    def publishes_kv_events(self) -> bool:
        """Whether rank 0 publishes KV cache events (and so the stages record their blocks)."""
        return self.kv_events is not None and self.kv_events.publishes

    def __post_init__(self) -> None:
        """Normalize the sequences (any sequence or None -> a tuple) and the model (a Path -> a
        str), then check every option; a bad one raises ValueError naming it."""
        object.__setattr__(self, "stage_num_blocks", tuple(self.stage_num_blocks or ()))
        if not isinstance(self.layer_split, str):  # "auto" | "even" stay words
            object.__setattr__(self, "layer_split", tuple(self.layer_split or ()))
        if isinstance(self.model, Path):
            object.__setattr__(self, "model", str(self.model))
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a built-in name or a directory, got {self.model!r}")
        self._check_pipeline()
        self._check_stages()
        self._check_kv_tier()
        self._check_hand_off()
        self._check_kv_events()

    @property
    def handoff_transport(self) -> str:
        """ "" (no hand-off), "directory" or "mooncake"."""
        if self.kv_transport is not None:
            return self.kv_transport
        return "directory" if self.kv_store is not None else ""

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    # ---- checks ------------------------------------------------------------------------------

    def _check_pipeline(self) -> None:
        """The stages, the policy, what each computes and where."""
        if not isinstance(self.pp, int) or isinstance(self.pp, bool) or self.pp < 1:
            raise ValueError(
                f"pp (the number of pipeline stages) must be a positive integer, got {self.pp!r}"
            )
        get_policy(self.policy, runtime=True)  # an unknown policy fails here, naming the valid ones
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}"
            )
        if not self.priority_aging_s > 0:
            raise ValueError(f"priority_aging_s must be > 0, got {self.priority_aging_s!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {self.dtype!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    def _check_stages(self) -> None:
        """Each stage's layers, cache and snapshot grid."""
        if self.stage_num_blocks and len(self.stage_num_blocks) != self.pp:
            raise ValueError(
                f"stage_num_blocks has {len(self.stage_num_blocks)} entries for {self.pp} stages"
            )
        self._check_layer_split()
        if any(n < 1 for n in self.stage_num_blocks):
            raise ValueError(f"stage_num_blocks must be positive, got {self.stage_num_blocks}")
        if self.kv_cache_gib is not None and not self.kv_cache_gib > 0:
            raise ValueError(f"kv_cache_gib must be positive, got {self.kv_cache_gib}")
        if not self.host_kv_gib >= 0:
            raise ValueError(f"host_kv_gib must be >= 0 (0: no host tier), got {self.host_kv_gib}")
        if self.snapshot_interval_blocks is not None and self.snapshot_interval_blocks < 1:
            raise ValueError(
                f"snapshot_interval_blocks must be >= 1, got {self.snapshot_interval_blocks}"
            )
        if not 0 <= self.snapshot_align_frac < 1:
            raise ValueError(
                f"snapshot_align_frac must be in [0, 1), got {self.snapshot_align_frac}"
            )

    def _check_layer_split(self) -> None:
        """ "auto", "even", or one positive layer count per stage (their sum is checked against
        the model's layers where the model is read: engine.py)."""
        split = self.layer_split
        if isinstance(split, str):
            if split not in SPLIT_SETTINGS:
                raise ValueError(
                    f"layer_split must be 'auto', 'even' or one layer count per stage, "
                    f"got {split!r}"
                )
            return
        if split and (
            len(split) != self.pp
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in split)
        ):
            raise ValueError(
                f"layer_split {list(split)} needs one positive layer count per stage "
                f"({self.pp} stages), or 'auto' or 'even'"
            )

    def _check_kv_tier(self) -> None:
        """The shared KV tier: which store, and where its master is."""
        if self.kv_tier is None:
            if self.kv_tier_master is not None or self.kv_tier_metadata is not None:
                raise ValueError("kv_tier_master / kv_tier_metadata need kv_tier='mooncake-store'")
            return
        if self.kv_tier not in KV_TIERS:
            raise ValueError(f"kv_tier must be one of {', '.join(KV_TIERS)}, got {self.kv_tier!r}")
        host, _, port = (self.kv_tier_master or "").rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"kv_tier={self.kv_tier!r} needs kv_tier_master as HOST:PORT (mooncake_master's "
                f"-rpc_port), got {self.kv_tier_master!r}"
            )
        if self.kv_tier_metadata is not None and not self.kv_tier_metadata.startswith("http"):
            raise ValueError(
                "kv_tier_metadata must be the metadata server's URL, e.g. "
                f"http://HOST:8080/metadata, got {self.kv_tier_metadata!r}"
            )
        if not self.kv_tier_segment_gib >= 1 / 64:
            raise ValueError(
                f"kv_tier_segment_gib must be at least 1/64 (16 MiB, Mooncake's smallest "
                f"segment), got {self.kv_tier_segment_gib}"
            )
        if not self.kv_tier_timeout_s > 0:
            raise ValueError(f"kv_tier_timeout_s must be positive, got {self.kv_tier_timeout_s}")

    def _check_kv_events(self) -> None:
        """KV cache events: a KVEventsConfig, or its JSON text or dict (made one here)."""
        events = self.kv_events
        if events is None or isinstance(events, KVEventsConfig):
            return
        try:
            if isinstance(events, str):
                events = KVEventsConfig.from_json(events)
            elif isinstance(events, dict):
                events = KVEventsConfig.from_json(json.dumps(events))
            else:
                raise ValueError(f"takes a KVEventsConfig, its JSON or a dict, got {events!r}")
        except ValueError as exc:
            raise ValueError(f"kv_events: {exc}") from None
        object.__setattr__(self, "kv_events", events)

    def _check_hand_off(self) -> None:
        """The KV hand-off: its transport (the registry, kv_transfer/transports.py) and bounds."""
        if self.kv_transport is not None and self.kv_transport not in TRANSPORTS:
            raise ValueError(f"kv_transport must be {transport_names()}, got {self.kv_transport!r}")
        if self.kv_store is not None and not str(self.kv_store):
            raise ValueError("kv_store must name a directory")
        transport = TRANSPORTS.get(self.kv_transport)
        if transport is not None and transport.needs_store and self.kv_store is None:
            raise ValueError(f"kv_transport={transport.name!r} needs kv_store (a directory)")
        if transport is not None and not transport.needs_store and self.kv_store is not None:
            raise ValueError(
                f"kv_store is the directory transport's; kv_transport={transport.name!r} takes none"
            )
        if transport is not None and transport.takes_host and self.kv_host:
            check_host(self.kv_host)  # an address this machine resolves, or ValueError
        if self.kv_transport_protocol not in KV_PROTOCOLS:
            raise ValueError(
                f"kv_transport_protocol must be 'tcp' or 'rdma', got {self.kv_transport_protocol!r}"
            )
        for name in ("kv_arena_gib", "kv_ttl_s", "kv_export_wait_s", "kv_transfer_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.kv_store_max_gib is not None and not self.kv_store_max_gib > 0:
            raise ValueError(f"kv_store_max_gib must be positive, got {self.kv_store_max_gib}")
