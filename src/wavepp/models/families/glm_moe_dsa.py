"""GLM-5: DeepSeek-V3's layers with DeepSeek sparse attention (DSA). A layer of indexer type
"full" runs its own indexer (and caches indexer keys); a "shared" one attends over the top-k
of the layer before it. RoPE is always interleaved.

Checkpoint names: DeepSeek-V3's, plus self_attn.indexer.{wq_b, wk, k_norm, weights_proj (fp32)}.
"""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.models.families.deepseek_v3 import DeepseekV3Config, tiny_mla_kwargs
from wavepp.models.spec import IndexSpec


@dataclass(frozen=True)
class GlmMoeDsaConfig(DeepseekV3Config):
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    indexer_types: tuple[str, ...] = ()  # per layer: "full" runs an indexer, "shared" reuses

    model_type = "glm_moe_dsa"
    architecture = "GlmMoeDsaForCausalLM"
    has_indexer = True

    def __post_init__(self) -> None:
        if (
            len(self.indexer_types) != self.num_layers
            or self.indexer_types[0] != "full"
            or set(self.indexer_types) - {"full", "shared"}
        ):
            raise ValueError(
                f"{type(self).__name__}.indexer_types {list(self.indexer_types)} must give "
                f"'full' or 'shared' for each of {self.num_layers} layers, 'full' first"
            )
        super().__post_init__()

    def index(self, layer: int) -> IndexSpec:
        return IndexSpec(
            self.index_topk,
            self.index_n_heads,
            self.index_head_dim,
            shared=self.indexer_types[layer] == "shared",
        )

    def runs_indexer(self, layer: int) -> bool:
        """This layer computes its own top-k (and keeps indexer keys in the cache)."""
        return self.indexer_types[layer] == "full"

    @classmethod
    def from_hf(cls, hf: dict) -> GlmMoeDsaConfig:
        fields = cls.hf_fields(hf)
        return cls(
            **{**fields, "rope_interleave": True},
            index_topk=hf["index_topk"],
            index_n_heads=hf["index_n_heads"],
            index_head_dim=hf["index_head_dim"],
            indexer_types=tuple(hf.get("indexer_types") or ["full"] * fields["num_layers"]),
        )


def tiny_hf_config(spec):
    """The transformers config of a tiny random checkpoint (`make_model.TinyModelSpec`): layers
    full, full, shared, full, shared, ... (layer 2 shares layer 1's top-k: splitting 4 layers
    in 2 or 3 stages puts a boundary there)."""
    import transformers

    indexer_types = spec.indexer_types or tuple(
        "full" if i == 0 or i % 2 else "shared" for i in range(spec.num_layers)
    )
    return transformers.GlmMoeDsaConfig(
        **tiny_mla_kwargs(spec),
        index_topk=spec.index_topk,
        index_n_heads=spec.index_n_heads,
        index_head_dim=spec.index_head_dim,
        indexer_types=list(indexer_types),
    )
