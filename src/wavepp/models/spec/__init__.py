"""The torch-free description of a model: layer kinds, RoPE, page layout, stage split, and
how checkpoint tensors become parameters. The runtime's models and the simulator read it."""

from wavepp.models.spec.attention import AttentionSpec, GQASpec, IndexSpec, KDASpec, MLASpec
from wavepp.models.spec.layer_split import (
    LayerCosts,
    StageSplit,
    balanced_split,
    stage_costs,
)
from wavepp.models.spec.mlp import DenseMLPSpec, MLPSpec, MoESpec
from wavepp.models.spec.model import LayerSpec, ModelSpec, StageSpec, split_layers, stage_specs
from wavepp.models.spec.page_layout import (
    CachePool,
    PageLayout,
    StatePool,
    page_layout,
)
from wavepp.models.spec.rope import Llama3RopeScaling, RopeSpec, YarnScaling, rope_parameters
from wavepp.models.spec.weights import EMBED, LM_HEAD, MlpNames, Param

__all__ = [
    "AttentionSpec",
    "CachePool",
    "DenseMLPSpec",
    "EMBED",
    "GQASpec",
    "IndexSpec",
    "KDASpec",
    "LM_HEAD",
    "LayerCosts",
    "LayerSpec",
    "Llama3RopeScaling",
    "MLASpec",
    "MLPSpec",
    "MlpNames",
    "ModelSpec",
    "MoESpec",
    "PageLayout",
    "Param",
    "RopeSpec",
    "StageSpec",
    "StageSplit",
    "StatePool",
    "YarnScaling",
    "balanced_split",
    "page_layout",
    "rope_parameters",
    "split_layers",
    "stage_costs",
    "stage_specs",
]
