"""Stage-sliced models over a paged cache: the Llama family (Llama, Qwen2, Qwen3) and the
MoE / latent-attention families (MiniMax-M2, DeepSeek-V3, GLM-5 with DSA).

A stage builds only its slice of the model (layers [start, end), plus the embedding on the
first stage and the final norm + LM head on the last) and reads only that slice's tensors
from the checkpoint. Its K/V live in fixed-size blocks whose ids the block manager chooses;
the model receives them as block tables in a `StageBatch`.
"""

from wavepp.models.attention import paged_attention
from wavepp.models.batch import ChunkSpec, StageBatch
from wavepp.models.config import (SUPPORTED_ARCHITECTURES, Llama3RopeScaling, ModelConfig, StageSpec,
                                  load_model_config, split_layers, stage_specs)
from wavepp.models.kv_cache import PagedKVCache
from wavepp.models.loader import CheckpointError, load_stage_model, read_tensors, stage_tensor_shapes
from wavepp.models.moe_config import MOE_MODEL_TYPES, MoEModelConfig
from wavepp.models.moe_stage_model import MoEStageModel
from wavepp.models.page_layout import CachePool, PageLayout, page_layout
from wavepp.models.paged_pools import PagedPools
from wavepp.models.pipeline import LinearBlockAllocator, LocalPipeline
from wavepp.models.stage_model import StageModel

__all__ = [
    "MOE_MODEL_TYPES", "SUPPORTED_ARCHITECTURES", "CachePool", "CheckpointError", "ChunkSpec",
    "LinearBlockAllocator", "Llama3RopeScaling", "LocalPipeline", "MoEModelConfig", "MoEStageModel",
    "ModelConfig", "PageLayout", "PagedKVCache", "PagedPools", "StageBatch", "StageModel", "page_layout",
    "StageSpec", "load_model_config", "load_stage_model", "paged_attention", "read_tensors",
    "split_layers", "stage_specs", "stage_tensor_shapes",
]
