"""Chunk ends moved onto snapshot boundaries: a post-pass over any planner's wave (hybrid models).

A hybrid model's request saves its recurrent state at every grid boundary it computes (multiples
of `snapshot_interval_blocks` blocks) and at its last reusable boundary, whatever the chunks
(cache/snapshot_plan.py). A chunk that ends between two of them carries its state to its next
chunk in the request's working slot; a chunk that ends on one ends at a resume point, where a
later request could start too. So, as the paper does, a planner's chunk end e moves to a
snapshot boundary b when that costs little:

    [start ............ b ...... e)      down: b in [e - tol, e), start < b
    [start ................ e ...... b)   up:   b in (e, e + tol], the wave has `room` tokens left
                                         (b may be the request's end: the chunk becomes its last)

    tol = snapshot_align_frac * (e - start), aligned down to the block size

The nearer of the two wins (down on a tie). A request's last chunk is never moved; a chunk
never grows past what the wave's budget left (`room`) nor shrinks to nothing, and every token
stays in its request (a chunk cut shorter leaves its tokens for a later wave). With
`snapshot_interval_blocks` 0 (a model without linear-attention layers) or
`snapshot_align_frac` 0 the wave is returned as it is.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from wavepp.sched.messages import Chunk
from wavepp.sched.request import Request


class SnapshotGrid(Protocol):
    """The three values alignment reads (a PlannerConfig has them): this module sits below the
    planners' base, which calls it, so it takes them by shape, not by importing the config."""

    @property
    def block_size(self) -> int: ...

    @property
    def snapshot_interval_blocks(self) -> int: ...

    @property
    def snapshot_align_frac(self) -> float: ...


def snapshot_positions(
    req: Request, start: int, end: int, block_size: int, interval_blocks: int
) -> list[int]:
    """Token positions in (start, end) where `req` keeps a snapshot: grid points and its last
    reusable boundary (the snapshot plan's boundaries), increasing."""
    step = interval_blocks * block_size
    points = set(range((start // step + 1) * step, end, step))
    last_reusable = (req.num_tokens - 1) // block_size * block_size
    if start < last_reusable < end:
        points.add(last_reusable)
    return sorted(points)


def aligned_end(req: Request, start: int, end: int, config: SnapshotGrid, room: int) -> int:
    """Where a non-final chunk [start, end) of `req` should end (`end` itself if no boundary
    is within the tolerance); rounding up uses at most `room` more tokens."""
    bs, frac = config.block_size, config.snapshot_align_frac
    tol = int(frac * (end - start)) // bs * bs
    if tol <= 0 or end >= req.num_tokens:
        return end
    below = snapshot_positions(
        req, max(start, end - tol - 1), end + 1, bs, config.snapshot_interval_blocks
    )
    if below and below[-1] == end:
        return end  # already on a boundary
    down = next((b for b in reversed(below) if end - tol <= b < end and b > start), None)
    up = None
    reach = min(tol, room)
    if reach > 0:
        above = snapshot_positions(
            req, end, min(req.num_tokens, end + reach + 1), bs, config.snapshot_interval_blocks
        )
        up = above[0] if above else (req.num_tokens if req.num_tokens - end <= reach else None)
    if down is not None and (up is None or end - down <= up - end):
        return down
    return up if up is not None else end


def align_chunk_ends(
    chunks: Sequence[Chunk], requests: Sequence[Request], config: SnapshotGrid, room: int
) -> list[Chunk]:
    """`chunks` with their ends moved onto snapshot boundaries (see the module docstring).
    `room`: tokens the wave may still take (its budget minus its chunks' tokens). Mutates
    nothing; a no-op unless `config.snapshot_interval_blocks` and `config.snapshot_align_frac`."""
    if not config.snapshot_interval_blocks or config.snapshot_align_frac <= 0 or not chunks:
        return list(chunks)
    by_id = {r.request_id: r for r in requests}
    out = []
    for chunk in chunks:
        req = by_id[chunk.request_id]
        end = chunk.end if chunk.is_last else aligned_end(req, chunk.start, chunk.end, config, room)
        if end != chunk.end:
            room -= end - chunk.end
            chunk = req.chunk(chunk.start, end)
        out.append(chunk)
    return out
