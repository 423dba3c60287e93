"""Reading the config.json fields several families share (pure Python)."""

from __future__ import annotations


def pick(hf: dict, *names: str, default=None):
    """The first of `names` the config sets (not null), else `default`."""
    return next((hf[n] for n in names if hf.get(n) is not None), default)


def refuse_unsupported(hf: dict) -> None:
    """What no family here computes: quantized checkpoints, activations other than SiLU."""
    if hf.get("quantization_config"):
        raise ValueError(
            f"quantized checkpoints ({hf['quantization_config'].get('quant_method', '?')}) "
            "are not supported; give a bf16 or fp32 checkpoint"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; only 'silu' (SwiGLU)")


def dense_layers(hf: dict, default_first_k: int) -> tuple[int, ...]:
    """Layers with a dense MLP: `mlp_layer_types` ("dense" | "sparse" per layer), else the
    first `first_k_dense_replace` layers (default `default_first_k`)."""
    num_layers = hf["num_hidden_layers"]
    kinds = hf.get("mlp_layer_types")
    if kinds is None:
        first_k = min(hf.get("first_k_dense_replace", default_first_k), num_layers)
        kinds = ["dense"] * first_k + ["sparse"] * (num_layers - first_k)
    return tuple(i for i, kind in enumerate(kinds) if kind == "dense")


def positive(owner: object, *names: str) -> None:
    """Raise ValueError naming the first of `names` that is not a positive int."""
    for name in names:
        value = getattr(owner, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{type(owner).__name__}.{name} must be a positive int, got {value!r}")
