"""Option parsing the commands share."""

from __future__ import annotations


def comma_list(text: str) -> list[str]:
    """The items of a comma-separated option: "a, b,,c" -> ["a", "b", "c"]."""
    return [t.strip() for t in text.split(",") if t.strip()]
