"""The `wavepp` command line: one module per command (models, make-model, prefill, bench,
simulate, serve), each with `add_parser(sub)` and its `run(args)`."""

from __future__ import annotations

import argparse
import sys

from wavepp.cli.args import comma_list

__all__ = ["comma_list", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="wavepp", description="Pipeline-parallel LLM prefill with cross-stage prefix reuse."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from wavepp.cli import bench, make_model, models, prefill, route, serve, simulate

    for command in (models, make_model, prefill, bench, simulate, serve, route):
        command.add_parser(sub)

    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"wavepp {args.command}: error: {exc}", file=sys.stderr)
        return 2
