"""One pipeline stage's KV block cache: pure Python, deterministic, no tensors, no threads.

`BlockPool` keeps the stage's blocks (ref counts, leaf-only LRU eviction on a logical clock,
a prefix index of chained hashes, leases and capacity escrow); `SnapshotPool` adds the
recurrent-state snapshots of hybrid models as attachments of blocks; `HostTier` keeps the
blocks eviction takes, in host memory, for a later request to load back (its bytes in a
`HostBlockStore`, the runtime's); `hash_blocks` names full blocks of a prompt. The leader (`wavepp.sched`) and the simulator drive the same pool.
"""

from wavepp.cache.block_log import BlockChanges, BlockLog
from wavepp.cache.errors import (
    AlreadyReleasedError,
    CacheError,
    IntegrityError,
    InvalidArgumentError,
    PendingBlockError,
    RequestStateError,
    UnknownRequestError,
)
from wavepp.cache.hashing import hash_blocks
from wavepp.cache.host_store import HostBlockStore
from wavepp.cache.host_tier import HostLoad, HostTier
from wavepp.cache.pool import BlockPool
from wavepp.cache.results import (
    CapacityView,
    CommitResult,
    LeaseResult,
    MatchResult,
    PoolRequestState,
    ReserveResult,
)
from wavepp.cache.snapshot_plan import default_interval_blocks, snapshot_boundaries
from wavepp.cache.snapshot_records import SnapshotMatch
from wavepp.cache.snapshots import SnapshotPool

__all__ = [
    "AlreadyReleasedError",
    "BlockChanges",
    "BlockLog",
    "BlockPool",
    "CacheError",
    "CapacityView",
    "CommitResult",
    "IntegrityError",
    "InvalidArgumentError",
    "LeaseResult",
    "MatchResult",
    "PendingBlockError",
    "PoolRequestState",
    "RequestStateError",
    "ReserveResult",
    "UnknownRequestError",
    "hash_blocks",
    "HostBlockStore",
    "HostLoad",
    "HostTier",
    "SnapshotPool",
    "SnapshotMatch",
    "default_interval_blocks",
    "snapshot_boundaries",
]
