"""What the router knows of the prompts it sent, free of HTTP: what a request's prefix is taken
of, its chained chunk hashes, and the approx policy's record of the hashes sent to one replica
(replica_table.py holds one per replica).

`prompt_key(body)`: what a prefix is taken of: a completion's prompt (token ids, or its text), a
chat's messages (their JSON). Text is chunked by characters, token ids by tokens.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Sequence

import xxhash

TEXT_CHUNK = 64  # characters a chunk of a text prompt
TOKEN_CHUNK = 16  # token ids a chunk of a prompt of ids
DEFAULT_MAX_PREFIXES = 65536  # chunk hashes a replica's record keeps


def prompt_key(body: dict) -> str | tuple[int, ...]:
    """What the prefix of a request is: a completion's prompt, or a chat's messages."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return tuple(prompt)
    if isinstance(prompt, str):
        return prompt
    if "messages" in body:
        return json.dumps(body["messages"], sort_keys=True, ensure_ascii=False)
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def chunk_hashes(key: str | tuple[int, ...]) -> list[int]:
    """Chained hashes of the key's whole chunks: hash i names chunks 0..i."""
    if isinstance(key, str):
        data, size = key.encode(), TEXT_CHUNK
        pieces = [data[i : i + size] for i in range(0, len(data) - size + 1, size)]
    else:
        size = TOKEN_CHUNK
        pieces = [
            b"".join(t.to_bytes(8, "little", signed=True) for t in key[i : i + size])
            for i in range(0, len(key) - size + 1, size)
        ]
    out, h = [], 0
    for piece in pieces:
        h = xxhash.xxh3_64_intdigest(piece, seed=h)
        out.append(h)
    return out


class PrefixRecord:
    """The chunk hashes sent to one replica, least recently sent first out."""

    def __init__(self, max_prefixes: int = DEFAULT_MAX_PREFIXES):
        self.max_prefixes = max_prefixes
        self._hashes: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading chunks were sent here (hash i names chunks 0..i: the first miss
        ends the match)."""
        n = 0
        for h in hashes:
            if h not in self._hashes:
                break
            n += 1
        return n

    def add(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self._hashes[h] = None
            self._hashes.move_to_end(h)
        while len(self._hashes) > self.max_prefixes:
            self._hashes.popitem(last=False)

    def clear(self) -> None:
        self._hashes.clear()
