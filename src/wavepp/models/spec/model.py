"""What the shared code knows of a model: its layers' kinds, and how a pipeline splits them.

A family's config record (`families/*.py`, parsed from an HF config.json) is a `ModelSpec`:
it keeps its own fields, and answers `layer(i)` with the layer's `LayerSpec` (its attention
and MLP kinds, `spec/attention.py`, `spec/mlp.py`) and `rope` with its RoPE table. The stage
model, the page layout, the loader and the simulator read only this interface, never a
family's fields, so a family is one file and nothing dispatches on model-type strings.

`StageSpec` is the half-open layer range [start_layer, end_layer) one stage owns; the first
stage also owns the token embedding, the last the final norm and the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

from wavepp.models.spec.attention import AttentionSpec
from wavepp.models.spec.mlp import MLPSpec
from wavepp.models.spec.rope import RopeSpec
from wavepp.models.spec.weights import MlpNames, Param, embed_and_head, one


@dataclass(frozen=True)
class LayerSpec:
    attention: AttentionSpec
    mlp: MLPSpec


class ModelSpec:
    """The interface of every family's config record. Subclasses are frozen dataclasses with
    at least these fields: model_type, architecture, vocab_size, hidden_size, num_layers,
    rms_norm_eps, max_position_embeddings, tie_word_embeddings; and they define `layers`
    (one LayerSpec per layer) and `rope` (None: no layer rotates)."""

    model_type: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    mlp_names: MlpNames = MlpNames()  # what its checkpoints call the MLP parts

    @cached_property
    def layers(self) -> tuple[LayerSpec, ...]:
        raise NotImplementedError

    @property
    def rope(self) -> RopeSpec | None:
        raise NotImplementedError

    def layer(self, index: int) -> LayerSpec:
        return self.layers[index]

    @property
    def is_hybrid(self) -> bool:
        """Some layers keep a recurrent state instead of per-token KV (snapshots)."""
        return any(layer.attention.kind == "kda" for layer in self.layers)

    def is_linear(self, index: int) -> bool:
        """Layer `index` is linear attention (state snapshots, no per-token cache)."""
        return self.layers[index].attention.kind == "kda"

    def reuses_topk(self, index: int) -> bool:
        """Layer `index` attends over the previous layer's DSA selection (False past the end)."""
        return index < self.num_layers and self.layers[index].attention.reuses_topk

    def stage_params(self, stage: StageSpec) -> list[Param]:
        """Every parameter of the slice `stage` and the checkpoint tensors it is made of."""
        hidden = self.hidden_size
        params = embed_and_head(
            self.vocab_size,
            hidden,
            first=stage.is_first,
            last=stage.is_last,
            tied=self.tie_word_embeddings,
        )
        for j, index in enumerate(range(stage.start_layer, stage.end_layer)):
            hf, ours, layer = f"model.layers.{index}.", f"layers.{j}.", self.layers[index]
            params += [
                one(ours + "input_norm.weight", hf + "input_layernorm.weight", (hidden,)),
                one(
                    ours + "post_attn_norm.weight",
                    hf + "post_attention_layernorm.weight",
                    (hidden,),
                ),
            ]
            params += layer.attention.params(hf + "self_attn.", ours + "attn.", hidden)
            params += layer.mlp.params(hf, ours + "mlp.", hidden, self.mlp_names)
        return params


@dataclass(frozen=True)
class StageSpec:
    """The layers [start_layer, end_layer) of a `num_layers`-layer model that one stage owns."""

    start_layer: int
    end_layer: int
    num_layers: int

    def __post_init__(self) -> None:
        if not 0 <= self.start_layer < self.end_layer <= self.num_layers:
            raise ValueError(
                f"stage layer range [{self.start_layer}, {self.end_layer}) is outside "
                f"the model's {self.num_layers} layers (need 0 <= start < end <= "
                f"{self.num_layers})"
            )

    @property
    def is_first(self) -> bool:
        """Owns the token embedding: takes input ids."""
        return self.start_layer == 0

    @property
    def is_last(self) -> bool:
        """Owns the final norm and LM head: returns logits."""
        return self.end_layer == self.num_layers

    @property
    def num_stage_layers(self) -> int:
        return self.end_layer - self.start_layer

    @classmethod
    def whole(cls, num_layers: int) -> StageSpec:
        return cls(0, num_layers, num_layers)


def split_layers(
    num_layers: int, num_stages: int, sizes: Sequence[int] = ()
) -> list[tuple[int, int]]:
    """Contiguous split. Default: balanced, stage sizes differ by at most one, the larger ones
    first (the last stage also runs the final norm and LM head). `sizes`: each stage's layer
    count, in order (vLLM's VLLM_PP_LAYER_PARTITION): for a stage that carries more than its
    layers (rank 0 also runs the leader), fewer layers there balance the pipeline."""
    if num_stages < 1 or num_stages > num_layers:
        raise ValueError(
            f"cannot split {num_layers} layers into {num_stages} stages "
            f"(need 1 <= num_stages <= {num_layers})"
        )
    if sizes:
        sizes = [int(n) for n in sizes]
        if len(sizes) != num_stages or min(sizes) < 1 or sum(sizes) != num_layers:
            raise ValueError(
                f"layer split {sizes} must give each of the {num_stages} stages at least one "
                f"layer and sum to the model's {num_layers} layers"
            )
        starts = [sum(sizes[:i]) for i in range(num_stages)]
        return [(start, start + n) for start, n in zip(starts, sizes)]
    base, extra = divmod(num_layers, num_stages)
    ranges, start = [], 0
    for stage in range(num_stages):
        end = start + base + (1 if stage < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


def stage_specs(num_layers: int, num_stages: int, sizes: Sequence[int] = ()) -> list[StageSpec]:
    return [
        StageSpec(start, end, num_layers)
        for start, end in split_layers(num_layers, num_stages, sizes)
    ]
