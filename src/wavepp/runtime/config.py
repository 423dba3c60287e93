"""What every rank needs to build its stage: a frozen, picklable record."""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.kv_transfer.transports import TRANSPORTS, transport_names


@dataclass(frozen=True)
class RuntimeConfig:
    model_path: str
    num_stages: int
    policy: str = "wavepp"
    dtype: str = "bfloat16"  # "bfloat16" | "float32"
    block_size: int = 16
    stage_num_blocks: tuple[int, ...] = ()  # one per stage; empty: from kv_cache_gib
    kv_cache_gib: float | None = None  # per stage, when stage_num_blocks is empty; None:
    # sized from the model and the machine (stage.py)
    top_k: int = 5  # logprobs returned per first token
    num_threads: int = 1  # compute threads per stage process
    backend: str = "gloo"  # the data plane's (activations); objects go over gloo
    device: str = "cpu"  # "cpu" | "cuda", resolved (runtime/device.py)
    run_dir: str = ""  # where stage processes leave error reports
    snapshot_interval_blocks: int | None = None  # hybrid models: snapshot grid; None: from memory
    snapshot_align_frac: float = 0.125  # hybrid models: PlannerConfig.snapshot_align_frac
    profile_waves: bool = True  # time waves of varied shape at start-up (runtime/profile.py)
    kv_store: str = ""  # KV hand-off over the directory store: where every stage writes
    kv_transport: str = ""  # "" (no hand-off), or a name in kv_transfer/transports.py
    kv_transport_protocol: str = "tcp"  # mooncake: "tcp" | "rdma"
    kv_host: str = ""  # mooncake: the address the stages' transfer engines listen on
    kv_arena_gib: float = 2.0  # mooncake: each stage's staging arena
    kv_ttl_s: float = 600.0  # a part not taken lives this long
    kv_export_wait_s: float = 60.0  # a hand-off's answer waits this long for the stages' reports
    layer_split: tuple[int, ...] = ()  # layers per stage, in order; empty: balanced (models/spec)

    def __post_init__(self) -> None:
        from wavepp.sched.policy import get_policy

        if (
            not isinstance(self.num_stages, int)
            or isinstance(self.num_stages, bool)
            or self.num_stages < 1
        ):
            raise ValueError(
                f"pp (the number of pipeline stages) must be a positive integer, "
                f"got {self.num_stages!r}"
            )
        get_policy(self.policy, runtime=True)  # an unknown policy fails here, naming the valid ones
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {self.dtype!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.stage_num_blocks and len(self.stage_num_blocks) != self.num_stages:
            raise ValueError(
                f"stage_num_blocks has {len(self.stage_num_blocks)} entries for "
                f"{self.num_stages} stages"
            )
        if self.layer_split and (
            len(self.layer_split) != self.num_stages or min(self.layer_split) < 1
        ):
            raise ValueError(
                f"layer_split {list(self.layer_split)} needs one positive layer count per stage "
                f"({self.num_stages} stages)"
            )
        if any(n < 1 for n in self.stage_num_blocks):
            raise ValueError(f"stage_num_blocks must be positive, got {self.stage_num_blocks}")
        if self.kv_cache_gib is not None and not self.kv_cache_gib > 0:
            raise ValueError(f"kv_cache_gib must be positive, got {self.kv_cache_gib}")
        if self.kv_transport and self.kv_transport not in TRANSPORTS:
            raise ValueError(f"kv_transport must be {transport_names()}, got {self.kv_transport!r}")
        if self.kv_transport and TRANSPORTS[self.kv_transport].needs_store and not self.kv_store:
            raise ValueError(f"the {self.kv_transport} KV transport needs kv_store (a directory)")
        if self.kv_transport_protocol not in ("tcp", "rdma"):
            raise ValueError(
                f"kv_transport_protocol must be 'tcp' or 'rdma', got {self.kv_transport_protocol!r}"
            )
        if not self.kv_arena_gib > 0:
            raise ValueError(f"kv_arena_gib must be positive, got {self.kv_arena_gib}")
        if not self.kv_ttl_s > 0:
            raise ValueError(f"kv_ttl_s must be positive, got {self.kv_ttl_s}")
        if not self.kv_export_wait_s > 0:
            raise ValueError(f"kv_export_wait_s must be positive, got {self.kv_export_wait_s}")
        if self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda' here (resolved), got {self.device!r}")
        if self.snapshot_interval_blocks is not None and self.snapshot_interval_blocks < 1:
            raise ValueError(
                f"snapshot_interval_blocks must be >= 1, got {self.snapshot_interval_blocks}"
            )
        if not 0 <= self.snapshot_align_frac < 1:
            raise ValueError(
                f"snapshot_align_frac must be in [0, 1), got {self.snapshot_align_frac}"
            )
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
