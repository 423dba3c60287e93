"""Where a stage's part of a transfer lies in its arena, as the answer's params say it, and the
reads that pull tokens [start, end) of it: one module both sides share (the stage writes by
it, the decode side reads by it).

A part is one contiguous run of the arena's data region, pool after pool (sorted by name), in
each pool layer after layer, in each layer `rows` rows of `width` values of `dtype` (`rows`:
the request's whole blocks, so the stage copies them straight out of its paged pools; the
first `num_tokens` rows are the prompt's):

    location = {"session": "10.0.0.5:15291", "stage": 1, "layers": [15, 30],
                "entry": 7, "seq": 1234567, "entry_addr": ..., "addr": ..., "nbytes": ...,
                "num_tokens": 1600, "rows": 1600, "dtype": "bfloat16",
                "pools": {"key": {"layers": [15, ..., 29], "width": 192, "offset": 0}, ...}}

`entry_addr` is the address of the part's entry in the stage's table (ledger.py: seq at +0,
released at +8); `addr` the address of its first byte.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import numpy as np
import torch

from wavepp.kv_transfer.mooncake.ledger import ALIGN

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
RELEASED_OFFSET = 8  # bytes from an entry's start to its `released` word


def prompt_digest(token_ids: Sequence[int]) -> str:
    """What both sides compare to know a transfer is of this prompt (not the ids themselves:
    they would make every answer as long as its prompt)."""
    data = np.asarray(list(token_ids), dtype="<i8").tobytes()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def pack_layout(shapes: dict[str, tuple[list[int], tuple, torch.dtype]]) -> tuple[int, dict]:
    """(bytes, {pool: {"layers", "width", "offset"}}) of a part holding, per pool, (model
    layers, its shape [layers, ..., width], dtype), each pool starting on a cache line."""
    pools, offset = {}, 0
    for name in sorted(shapes):
        layers, shape, dtype = shapes[name]
        pools[name] = {"layers": list(layers), "width": int(shape[-1]), "offset": offset}
        offset += -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
    return offset, pools


def check_location(location) -> str | None:
    """Why `location` (from a request's params, so from outside) cannot be read, or None."""
    if not isinstance(location, dict):
        return "a stage's location is not an object"
    for key in ("entry_addr", "addr", "nbytes", "num_tokens", "rows", "seq", "stage"):
        value = location.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"a stage's location has no valid {key!r}"
    if location["rows"] < location["num_tokens"]:
        return "a stage's location holds fewer rows than tokens"
    if not isinstance(location.get("session"), str) or ":" not in location["session"]:
        return "a stage's location names no transfer engine session"
    if location.get("dtype") not in DTYPES:
        return f"a stage's location has the dtype {location.get('dtype')!r}"
    pools = location.get("pools")
    if not isinstance(pools, dict) or not pools:
        return "a stage's location names no pools"
    itemsize = DTYPES[location["dtype"]].itemsize
    for name, pool in pools.items():
        if not isinstance(pool, dict):
            return f"pool {name!r} is not an object"
        layers, width, offset = pool.get("layers"), pool.get("width"), pool.get("offset")
        if (
            not isinstance(layers, list)
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
            or not isinstance(width, int)
            or not isinstance(offset, int)
            or width < 1
            or offset < 0
        ):
            return f"pool {name!r} has no valid layers, width or offset"
        if offset + len(layers) * location["rows"] * width * itemsize > location["nbytes"]:
            return f"pool {name!r} reaches past the part's {location['nbytes']} bytes"
    return None


def part_bytes(location: dict, start: int, end: int) -> int:
    """Bytes of tokens [start, end) of the part, every pool and layer."""
    itemsize = DTYPES[location["dtype"]].itemsize
    return sum(
        len(pool["layers"]) * (end - start) * pool["width"] * itemsize
        for pool in location["pools"].values()
    )


def read_plan(
    location: dict, start: int, end: int, local: torch.Tensor
) -> tuple[list[tuple[int, int, int]], dict[str, tuple[list[int], torch.Tensor]]]:
    """The reads that pull tokens [start, end) of the part into `local` (a registered uint8
    tensor of at least part_bytes), and the rows they fill there: {pool: (model layers,
    [layers, end - start, width])}, views of `local`."""
    dtype = DTYPES[location["dtype"]]
    itemsize = dtype.itemsize
    rows_per_layer = location["rows"]
    segments, views, at = [], {}, 0
    base = local.data_ptr()
    for name in sorted(location["pools"]):
        pool = location["pools"][name]
        width, layers = pool["width"], pool["layers"]
        row_bytes = width * itemsize
        run = (end - start) * row_bytes
        for j in range(len(layers)):
            remote = location["addr"] + pool["offset"] + (j * rows_per_layer + start) * row_bytes
            segments.append((base + at + j * run, remote, run))
        size = len(layers) * run
        views[name] = (
            list(layers),
            local[at : at + size].view(dtype).view(len(layers), end - start, width),
        )
        at += size
    return segments, views
