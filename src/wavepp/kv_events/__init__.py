"""KV cache events: the blocks every stage holds, published as vLLM publishes its own
(docs/serving.md, "Behind a KV-aware router")."""

from wavepp.kv_events.all_stage_blocks import AllCleared, AllStageBlocks, RemovedBlock, StoredBlock
from wavepp.kv_events.config import KVEventsConfig

__all__ = ["AllCleared", "AllStageBlocks", "KVEventsConfig", "RemovedBlock", "StoredBlock"]
