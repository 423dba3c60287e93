"""Answers serialized without holding everybody else: JSON in pieces, the cyclic collector
paused while an answer's objects are built.

Both exist for one reason: the event loop and the engine's threads share the GIL with whoever
builds an answer, and a large answer (20 logprobs at each of 8,000 prompt positions) would
otherwise hold it for tens to hundreds of milliseconds at a stretch, in one C call or one
garbage collection.
"""

from __future__ import annotations

import contextlib
import gc
import json
import threading


def json_bytes(value) -> bytes:
    """`value` as compact JSON (what json.dumps gives with separators (",", ":") and
    ensure_ascii off), serialized in pieces: what holds at most PIECE_ITEMS items at every
    depth goes to one C-level json.dumps call, larger containers are walked here. One call for
    the whole value holds the GIL throughout (16 choices of 20 logprobs at each of 500
    positions, 16 MB: 0.3 s), and the event loop would wait as long; in pieces it takes ~30%
    longer and lets go of the GIL between them."""
    pieces: list[bytes] = []
    _encode(value, pieces)
    return b"".join(pieces)  # a copy of bytes, milliseconds for tens of MB


PIECE_ITEMS = 4096  # the most items (at any depth) one json.dumps call serializes
_CONTAINERS = (dict, list, tuple)
_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def _room(value, budget: int) -> int:
    """`budget` less the items `value` holds at every depth; negative once past it (counting
    stops there)."""
    items = value.values() if isinstance(value, dict) else value
    budget -= len(items)
    for item in items:
        if budget < 0:
            break
        if isinstance(item, _CONTAINERS):
            budget = _room(item, budget)
    return budget


def _encode(value, pieces: list[bytes]) -> None:
    if not isinstance(value, _CONTAINERS) or _room(value, PIECE_ITEMS) >= 0:
        pieces.append(_dumps(value).encode())
    elif isinstance(value, dict):
        pieces.append(b"{")
        for i, (key, item) in enumerate(value.items()):
            pieces.append((("," if i else "") + _key(key) + ":").encode())
            _encode(item, pieces)
        pieces.append(b"}")
    else:
        # runs of items that fit PIECE_ITEMS together go to one call; a larger item is walked
        pieces.append(b"[")
        run: list = []
        room = PIECE_ITEMS
        first = True
        for item in value:
            left = _room(item, room - 1) if isinstance(item, _CONTAINERS) else room - 1
            if left < 0 and run:
                pieces.append((("" if first else ",") + _dumps(run)[1:-1]).encode())
                first, run, room = False, [], PIECE_ITEMS
                left = _room(item, room - 1) if isinstance(item, _CONTAINERS) else room - 1
            if left < 0:
                pieces.append(b"" if first else b",")
                _encode(item, pieces)
                first = False
            else:
                run.append(item)
                room = left
        if run:
            pieces.append((("" if first else ",") + _dumps(run)[1:-1]).encode())
        pieces.append(b"]")


def _key(key) -> str:
    """A dict key as json.dumps writes it, quoted (ints, floats, booleans and None as strings)."""
    return _dumps(key) if isinstance(key, str) else _dumps({key: 0})[1:-3]


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection while any thread is inside. An answer of 20 logprobs at
    each of 8,000 positions makes a million dicts; each full collection they trigger walks the
    whole heap holding the GIL (measured: 14-158 ms each, several in a row, every other request
    waiting). Those dicts hold no cycles (reference counting frees them), so nothing is lost by
    collecting only once the last builder leaves."""
    global _num_paused, _gc_was_enabled
    with _gc_lock:
        if _num_paused == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _num_paused += 1
    try:
        yield
    finally:
        with _gc_lock:
            _num_paused -= 1
            if _num_paused == 0 and _gc_was_enabled:
                gc.enable()


_gc_lock = threading.Lock()
_num_paused = 0
_gc_was_enabled = True
