"""Stage-sliced models over a paged cache, for every family of the registry.

    registry.py     model_type -> family (one line each), config.json -> its config record
    families/       one file a family: its config mapping, layer kinds, checkpoint names
    spec/           torch-free: layer kinds, RoPE, page layout, stage split, weight map
    layers/         the modules every family is built from (norm, RoPE, MLP, MoE, GQA, MLA, KDA)
    kernels/        projections, attention, the C++ CPU kernels (csrc/), their per-process choice
    stage_model.py  one StageModel for every family; paged_pools.py, its cache; loader.py

A stage builds only its slice of the model (layers [start, end), plus the embedding on the
first stage and the final norm + LM head on the last) and reads only that slice's tensors
from the checkpoint. Its cache lives in fixed-size blocks whose ids the block manager chooses;
the model receives them as block tables in a `StageBatch`.

Importing this package imports no torch: the registry, the specs and the page layout are pure
Python (the simulator reads them). The torch-side names below load on first use.
"""

from wavepp.models.registry import (
    FAMILIES,
    MODEL_TYPES,
    SUPPORTED_ARCHITECTURES,
    load_model_config,
    parse_config,
)
from wavepp.models.spec import (
    CachePool,
    Llama3RopeScaling,
    ModelSpec,
    PageLayout,
    StageSpec,
    page_layout,
    split_layers,
    stage_specs,
)

_LAZY = {  # name -> module, imported (with torch) when the name is first asked for
    "ChunkSpec": "batch",
    "StageBatch": "batch",
    "CheckpointError": "loader",
    "load_stage_model": "loader",
    "read_tensors": "loader",
    "LinearBlockAllocator": "local_pipeline",
    "LocalPipeline": "local_pipeline",
    "PagedPools": "paged_pools",
    "StageModel": "stage_model",
    "Kernels": "kernels",
}

__all__ = [
    "CachePool",
    "FAMILIES",
    "Llama3RopeScaling",
    "MODEL_TYPES",
    "ModelSpec",
    "PageLayout",
    "SUPPORTED_ARCHITECTURES",
    "StageSpec",
    "load_model_config",
    "page_layout",
    "parse_config",
    "split_layers",
    "stage_specs",
    *_LAZY,
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'wavepp.models' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"wavepp.models.{_LAZY[name]}"), name)
