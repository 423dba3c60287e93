"""KV cache events on the wire, as vLLM 0.32 sends them (vllm/distributed/kv_events.py), so
that what reads vLLM's stream (llm-d's KV-cache indexer, Dynamo's KV router, vLLM's own
classes) reads ours:

    frame 1   topic (UTF-8)
    frame 2   sequence number: 8 bytes, big-endian, from 0, one per batch
    frame 3   msgpack of a batch: an array [ts (float seconds), [events], data_parallel_rank]

Each event is a msgpack map tagged by its class name under "type" (msgspec's tagged structs):
fields without a default are always written (None as nil), fields with one only when set.

    BlockStored       block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
                      lora_name: consecutive blocks of one chain and one medium, their token
                      ids end to end
    BlockRemoved      block_hashes, medium (blocks of one medium)
    AllBlocksCleared  (no field)

A block hash is only an identity here (a router hashes the token ids itself): ours are the
pool's 64-bit chained hashes, sent as unsigned integers. The replay socket answers a request
frame (the first sequence number wanted, 8 bytes big-endian) with each buffered batch as
[b"", topic, seq, payload] and then [b"", b"", END_SEQ, b""].
"""

from __future__ import annotations

from typing import Any

import msgspec

from wavepp.kv_events.all_stage_blocks import AllCleared, RemovedBlock, StoredBlock

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # ends a replay


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _Event(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(_Event):
    pass


_ENCODER = msgspec.msgpack.Encoder()


def encode_batch(
    ts: float,
    events: list[StoredBlock | RemovedBlock | AllCleared],
    block_size: int,
    data_parallel_rank: int = 0,
) -> bytes:
    """The third frame of one batch: `events` in order, a run of stored blocks of one medium
    where each is the previous one's child sent as one BlockStored, a run of removed ones of one
    medium as one BlockRemoved."""
    out: list[_Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, StoredBlock):
            if (
                isinstance(last, BlockStored)
                and event.parent_hash == last.block_hashes[-1]
                and event.medium == last.medium
            ):
                last.block_hashes.append(event.block_hash)
                last.token_ids.extend(event.token_ids)
                continue
            out.append(
                BlockStored(
                    [event.block_hash],
                    event.parent_hash,
                    list(event.token_ids),
                    block_size,
                    None,
                    event.medium,
                    None,
                )
            )
        elif isinstance(event, RemovedBlock):
            if isinstance(last, BlockRemoved) and event.medium == last.medium:
                last.block_hashes.append(event.block_hash)
                continue
            out.append(BlockRemoved([event.block_hash], event.medium))
        else:
            out.append(AllBlocksCleared())
    return _ENCODER.encode(EventBatch(ts, out, data_parallel_rank))
