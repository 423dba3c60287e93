"""What every rank needs to build its stage: a frozen, picklable record."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeConfig:
    model_path: str
    num_stages: int
    policy: str = "wavepp"
    dtype: str = "bfloat16"               # "bfloat16" | "float32"
    block_size: int = 16
    stage_num_blocks: tuple[int, ...] = ()  # one per stage; empty: from kv_cache_gib
    kv_cache_gib: float = 1.0             # per stage, when stage_num_blocks is empty
    top_k: int = 5                        # logprobs returned per first token
    num_threads: int = 1                  # compute threads per stage process
    backend: str = "gloo"
    run_dir: str = ""                     # where stage processes leave error reports

    def __post_init__(self) -> None:
        if self.num_stages < 1:
            raise ValueError(f"num_stages (pp) must be >= 1, got {self.num_stages}")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {self.dtype!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.stage_num_blocks and len(self.stage_num_blocks) != self.num_stages:
            raise ValueError(f"stage_num_blocks has {len(self.stage_num_blocks)} entries for "
                             f"{self.num_stages} stages")
        if any(n < 1 for n in self.stage_num_blocks):
            raise ValueError(f"stage_num_blocks must be positive, got {self.stage_num_blocks}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
