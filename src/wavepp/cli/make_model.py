"""`wavepp make-model`: a tiny seeded random-weight HF checkpoint, or one at a real model's
shapes (`--set FIELD=VALUE` reaches every field of `TinyModelSpec`: head_dim, the experts,
the MLA ranks, ...)."""

from __future__ import annotations

import dataclasses

from wavepp.random_checkpoint import SUPPORTED_ARCHS


def add_parser(sub) -> None:
    p = sub.add_parser("make-model", help="write a tiny random-weight HF checkpoint (seeded)")
    p.add_argument("path", help="output directory")
    p.add_argument("--arch", default="llama", choices=list(SUPPORTED_ARCHS))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--tie-word-embeddings", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other field of the checkpoint's spec (wavepp.random_checkpoint.TinyModelSpec), "
        "e.g. --set head_dim=128 --set num_experts=64 --set kv_lora_rank=512; repeatable",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from wavepp.random_checkpoint import TinyModelSpec, make_model

    spec = TinyModelSpec(
        arch=args.arch,
        num_layers=args.layers,
        hidden_size=args.hidden_size,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate_size,
        vocab_size=args.vocab_size,
        tie_word_embeddings=args.tie_word_embeddings,
        seed=args.seed,
        **spec_overrides(args.set),
    )
    path = make_model(args.path, spec)
    print(
        f"wrote {spec.arch} ({spec.num_layers} layers, hidden {spec.hidden_size}, "
        f"vocab {spec.vocab_size}, seed {spec.seed}) to {path}"
    )
    return 0


def spec_overrides(settings: list[str]) -> dict:
    """FIELD=VALUE strings -> TinyModelSpec keyword arguments, each VALUE read as its field is
    typed (int, float, bool as true/false, a comma list for a tuple). Raises ValueError naming
    a bad setting."""
    from wavepp.random_checkpoint import TinyModelSpec

    # the field's annotation, a string (`from __future__ import annotations` there)
    types = {f.name: str(f.type) for f in dataclasses.fields(TinyModelSpec)}
    flags = {"arch", "num_layers", "hidden_size", "num_heads", "num_kv_heads"}
    flags |= {"intermediate_size", "vocab_size", "tie_word_embeddings", "seed"}
    overrides: dict = {}
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not sep or name not in types or name in flags:
            known = ", ".join(sorted(set(types) - flags))
            raise ValueError(
                f"--set {setting!r}: give FIELD=VALUE with FIELD one of {known} (the others "
                f"have flags of their own)"
            )
        overrides[name] = _typed(name, value, types[name])
    return overrides


def _typed(name: str, value: str, annotation: str):
    try:
        if annotation.startswith("tuple"):
            return tuple(v.strip() for v in value.split(","))
        if annotation.startswith("bool"):
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        if annotation.startswith("float"):
            return float(value)
        return int(value)  # int, or int | None (head_dim)
    except ValueError:
        raise ValueError(f"--set {name}={value}: not a value of {name} ({annotation})") from None
