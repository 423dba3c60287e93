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
        raise ValueError(f"--layer-split takes layer counts separated by commas, e.g. 14,16; got {text!r}") from None
