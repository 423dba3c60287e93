"""Option parsing the commands share."""

from __future__ import annotations


def comma_list(text: str) -> list[str]:
    """The items of a comma-separated option: "a, b,,c" -> ["a", "b", "c"]."""
    return [t.strip() for t in text.split(",") if t.strip()]


def layer_split(text: str | None) -> list[int] | None:
    """--layer-split "14,16" -> [14, 16]; None or "" -> None (balanced). A non-integer is a
    ValueError naming the option."""
    if not text:
        return None
    try:
        return [int(t) for t in comma_list(text)]
    except ValueError:
        raise ValueError(
            f"--layer-split takes layer counts separated by commas, e.g. 14,16; got {text!r}"
        ) from None


def add_stage_args(p) -> None:
    """--layer-split and --no-pin-cpus, how the layers and CPUs are shared out among stages."""
    p.add_argument(
        "--layer-split",
        default=None,
        metavar="N,N,...",
        help="layers per stage, comma separated (default: balanced)",
    )
    p.add_argument(
        "--no-pin-cpus",
        dest="pin_cpus",
        action="store_false",
        default=None,
        help="leave the stage processes unpinned (default on the CPU: each stage pinned to "
        "CPUs of its own)",
    )
