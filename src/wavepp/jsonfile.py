"""The JSON file that `wavepp bench` and `wavepp simulate` write: {"meta": ..., "rows": [...]}."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence


def write_json(path: str | Path, rows: Sequence[dict], meta: dict | None = None) -> None:
    Path(path).write_text(json.dumps({"meta": meta or {}, "rows": list(rows)}, indent=1) + "\n")
