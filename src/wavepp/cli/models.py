"""`wavepp models`: the built-in models and where they are."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list the built-in models and where they are")
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from wavepp.model_store import DEFAULT_MODEL, list_models, wavepp_home

    table = Table(title=f"wavepp models (WAVEPP_HOME={wavepp_home()})")
    for col in ("name", "status", "path", "description"):
        table.add_column(col)
    for entry in list_models():
        name = entry.name + (" (default)" if entry.name == DEFAULT_MODEL else "")
        table.add_row(name, entry.status, str(entry.path or "-"), entry.description)
    Console().print(table)
    print("--model also takes the path of any HF-format directory (config.json + *.safetensors).")
    return 0
