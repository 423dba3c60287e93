"""`wavepp make-model`: a tiny seeded random-weight HF checkpoint."""

from __future__ import annotations

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
    )
    path = make_model(args.path, spec)
    print(
        f"wrote {spec.arch} ({spec.num_layers} layers, hidden {spec.hidden_size}, "
        f"vocab {spec.vocab_size}, seed {spec.seed}) to {path}"
    )
    return 0
