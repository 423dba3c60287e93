"""The `wavepp` command line."""

from __future__ import annotations

import argparse
import sys

from wavepp.make_model import SUPPORTED_ARCHS


def comma_list(text: str) -> list[str]:
    """The items of a comma-separated option: "a, b,,c" -> ["a", "b", "c"]."""
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="wavepp", description="Pipeline-parallel LLM prefill with cross-stage prefix reuse.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list the built-in models and where they are")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("make-model", help="write a tiny random-weight HF checkpoint (seeded)")
    p.add_argument("path", help="output directory")
    p.add_argument("--arch", default="llama", choices=SUPPORTED_ARCHS)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--tie-word-embeddings", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_make_model)

    from wavepp import cli_bench, cli_prefill, cli_simulate
    cli_prefill.add_parser(sub)
    cli_bench.add_parser(sub)
    cli_simulate.add_parser(sub)

    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"wavepp {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _cmd_models(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from wavepp.store import DEFAULT_MODEL, list_models, wavepp_home

    table = Table(title=f"wavepp models (WAVEPP_HOME={wavepp_home()})")
    for col in ("name", "status", "path", "description"):
        table.add_column(col)
    for entry in list_models():
        name = entry.name + (" (default)" if entry.name == DEFAULT_MODEL else "")
        table.add_row(name, entry.status, str(entry.path or "-"), entry.description)
    Console().print(table)
    print("--model also takes the path of any HF-format directory (config.json + *.safetensors).")
    return 0


def _cmd_make_model(args) -> int:
    from wavepp.make_model import TinyModelSpec, make_model

    spec = TinyModelSpec(arch=args.arch, num_layers=args.layers, hidden_size=args.hidden_size,
                         num_heads=args.heads, num_kv_heads=args.kv_heads,
                         intermediate_size=args.intermediate_size, vocab_size=args.vocab_size,
                         tie_word_embeddings=args.tie_word_embeddings, seed=args.seed)
    path = make_model(args.path, spec)
    print(f"wrote {spec.arch} ({spec.num_layers} layers, hidden {spec.hidden_size}, "
          f"vocab {spec.vocab_size}, seed {spec.seed}) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
