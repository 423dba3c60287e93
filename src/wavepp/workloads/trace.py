"""Replay of a Mooncake JSONL trace (FAST'25 release, `hash_ids` per 512-token block).

Each line: {"timestamp": ms, "input_length": tokens, "output_length": n, "hash_ids": [...]}.
Two requests that share their first k ids share their first k blocks. No token content is
published, so each id gets its own deterministic block of token ids (drawn from a generator
seeded by (seed, id)): equal ids give equal tokens, distinct ids distinct ones.

Scaling: a trace block of 512 tokens becomes `tokens_per_block` tokens, and the last,
partial block keeps its share of that (rounded, at least one token):

    ids [h0, h1, ..., h_{k-1}]:   h0 .. h_{k-2} full blocks | h_{k-1}: input_length - (k-1)*512
    replayed: (k-1)*tokens_per_block + max(1, round(last * tokens_per_block / 512))

so the sharing structure is kept while a CPU can afford the prompts. Timestamps become
seconds times `time_scale` (time_scale < 1 replays faster).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from wavepp.workloads.workload import Workload

TRACE_BLOCK_TOKENS = 512  # Mooncake's hash block (README of the trace)


def trace(
    path: str | Path,
    *,
    tokens_per_block: int = TRACE_BLOCK_TOKENS,
    max_requests: int | None = None,
    time_scale: float = 1.0,
    vocab_size: int = 32000,
    seed: int = 0,
    block_size: int = 16,
) -> Workload:
    """Load a Mooncake trace as a Workload with arrival times. Errors name the line."""
    if tokens_per_block <= 0:
        raise ValueError(f"tokens_per_block must be positive, got {tokens_per_block}")
    if max_requests is not None and max_requests <= 0:
        raise ValueError(f"max_requests must be positive, got {max_requests}")
    if time_scale < 0:
        raise ValueError(f"time_scale must be >= 0, got {time_scale}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    blocks: dict[int, list[int]] = {}
    prompts: list[list[int]] = []
    times: list[float] = []
    with path.open() as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if max_requests is not None and len(prompts) >= max_requests:
                break
            timestamp_ms, input_length, hash_ids = _parse(line, line_no, path)
            prompt: list[int] = []
            for hash_id in hash_ids:
                if hash_id not in blocks:
                    rng = np.random.default_rng([seed, hash_id])
                    blocks[hash_id] = rng.integers(1, vocab_size, size=tokens_per_block).tolist()
                prompt.extend(blocks[hash_id])
            last = input_length - (len(hash_ids) - 1) * TRACE_BLOCK_TOKENS
            keep = max(1, round(last * tokens_per_block / TRACE_BLOCK_TOKENS))
            del prompt[len(prompt) - tokens_per_block + keep :]
            prompts.append(prompt)
            times.append(timestamp_ms / 1000.0 * time_scale)
    if not prompts:
        raise ValueError(f"{path}: no requests in the trace")
    t0 = times[0]
    return Workload(
        f"trace:{path.name}",
        prompts,
        block_size,
        tuple(t - t0 for t in times),
        description=f"{len(prompts)} requests of {path.name}, {tokens_per_block} tokens "
        f"per {TRACE_BLOCK_TOKENS}-token block, time x{time_scale:g}",
    )


def _parse(line: str, line_no: int, path: Path) -> tuple[float, int, list[int]]:
    where = f"{path}:{line_no}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object")
    for key in ("timestamp", "input_length", "hash_ids"):
        if key not in record:
            raise ValueError(f"{where}: missing field {key!r}")
    timestamp, input_length, hash_ids = (
        record["timestamp"],
        record["input_length"],
        record["hash_ids"],
    )
    if not isinstance(timestamp, (int, float)) or timestamp < 0:
        raise ValueError(f"{where}: timestamp must be a number >= 0, got {timestamp!r}")
    if not isinstance(input_length, int) or input_length <= 0:
        raise ValueError(f"{where}: input_length must be a positive integer, got {input_length!r}")
    if (
        not isinstance(hash_ids, list)
        or not hash_ids
        or not all(isinstance(h, int) for h in hash_ids)
    ):
        raise ValueError(f"{where}: hash_ids must be a non-empty list of integers")
    last = input_length - (len(hash_ids) - 1) * TRACE_BLOCK_TOKENS
    if not 0 < last <= TRACE_BLOCK_TOKENS:
        raise ValueError(
            f"{where}: input_length {input_length} does not fit {len(hash_ids)} "
            f"blocks of {TRACE_BLOCK_TOKENS} tokens"
        )
    return float(timestamp), input_length, hash_ids
