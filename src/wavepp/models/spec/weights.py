"""How a checkpoint's tensors become a stage's parameters: data, read by one generic loader.

A `Param` names one parameter of the stage model (its state-dict name) and the HF tensors it
is made of, with their shapes and how they combine:

    one          the one tensor as stored
    cat          concatenated along dim 0            (q | k | v, gate | up)
    stack        stacked into a new dim 0            (experts' down projections: [E, H, I])
    stack_pairs  sources (a0, b0, a1, b1, ...): stack(cat(a_e, b_e))   (experts' gate | up)
    conv         cat of t[:, 0] of [C, 1, taps] tensors: [sum C, taps] (KDA short convolutions)
    flatten      the one tensor flattened            (KDA's A_log [1, 1, heads, 1] -> [heads])

Each layer kind declares its own params (`spec/layers.py`), as it declares its own cache
pools; a family only names what its checkpoints call things (`MlpNames`). Params marked
fp32 stay fp32 whatever the model dtype (routers and indexer weights make discrete choices).
"""

from __future__ import annotations

from dataclasses import dataclass

COMBINES = ("one", "cat", "stack", "stack_pairs", "conv", "flatten")

EMBED = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
FINAL_NORM = "model.norm.weight"


@dataclass(frozen=True)
class Param:
    target: str  # the stage model's state-dict name
    sources: tuple[tuple[str, tuple[int, ...]], ...]  # (HF tensor name, expected shape), in order
    combine: str = "one"
    fp32: bool = False
    fallback: str | None = None  # read this tensor where the source is absent

    def __post_init__(self) -> None:
        if self.combine not in COMBINES:
            raise ValueError(f"Param.combine {self.combine!r} is not one of {COMBINES}")
        if not self.sources:
            raise ValueError(f"Param {self.target!r} has no source tensor")


@dataclass(frozen=True)
class MlpNames:
    """What a family's checkpoints call the parts of a layer's MLP, under model.layers.{i}.

    dense_block.{gate, up, down}_proj            a dense SwiGLU
    moe_block.gate.weight                        the router
    moe_block.{router_bias}                      its score-correction bias (None: no bias)
    moe_block.experts.{e}.{expert[0..2]}         routed experts (gate, up, down)
    moe_block.shared_experts.{gate, up, down}_proj
    """

    dense_block: str = "mlp"
    moe_block: str = "mlp"
    expert: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    router_bias: str | None = "gate.e_score_correction_bias"


def one(target: str, name: str, shape: tuple[int, ...], *, fp32: bool = False) -> Param:
    return Param(target, ((name, shape),), fp32=fp32)


def cat(target: str, sources: list[tuple[str, tuple[int, ...]]]) -> Param:
    return Param(target, tuple(sources), "cat")


def swiglu(
    target: str,
    prefix: str,
    hidden: int,
    inter: int,
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
) -> list[Param]:
    """A SwiGLU's two params: gate | up fused, and down."""
    gate, up, down = names
    return [
        cat(
            f"{target}gate_up_proj",
            [
                (f"{prefix}{gate}.weight", (inter, hidden)),
                (f"{prefix}{up}.weight", (inter, hidden)),
            ],
        ),
        one(f"{target}down_proj", f"{prefix}{down}.weight", (hidden, inter)),
    ]


def embed_and_head(
    vocab_size: int, hidden: int, *, first: bool, last: bool, tied: bool
) -> list[Param]:
    """The first stage's embedding; the last stage's final norm and LM head (a tied head reads
    the embedding where the checkpoint has no lm_head.weight)."""
    params = [one("embed", EMBED, (vocab_size, hidden))] if first else []
    if last:
        params.append(one("norm.weight", FINAL_NORM, (hidden,)))
        params.append(
            Param("lm_head", ((LM_HEAD, (vocab_size, hidden)),), fallback=EMBED if tied else None)
        )
    return params
