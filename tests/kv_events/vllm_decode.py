"""Run in vLLM's own venv (.venv-vllm): decode KV event batches with vLLM's classes and print
what they hold as JSON, one line per batch. Reads from stdin either hex payloads, one a line,
or (with --subscribe ENDPOINT TOPIC SECONDS) subscribes and decodes what comes until SECONDS
pass with nothing new; --replay ENDPOINT FIRST_SEQ asks the replay socket instead."""

from __future__ import annotations

import json
import sys

import msgspec
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


def describe(seq: int, payload: bytes) -> dict:
    batch = DECODER.decode(payload)
    events = []
    for event in batch.events:
        if isinstance(event, BlockStored):
            events.append(
                {
                    "type": "stored",
                    "block_hashes": event.block_hashes,
                    "parent": event.parent_block_hash,
                    "token_ids": event.token_ids,
                    "block_size": event.block_size,
                    "lora_id": event.lora_id,
                    "lora_name": event.lora_name,
                    "medium": event.medium,
                }
            )
        elif isinstance(event, BlockRemoved):
            events.append(
                {"type": "removed", "block_hashes": event.block_hashes, "medium": event.medium}
            )
        elif isinstance(event, AllBlocksCleared):
            events.append({"type": "cleared"})
        else:
            raise TypeError(f"not one of vLLM's events: {event!r}")
    return {"seq": seq, "ts": batch.ts, "dp_rank": batch.data_parallel_rank, "events": events}


def subscribe(endpoint: str, topic: str, quiet_s: float) -> None:
    import zmq

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    print(json.dumps({"ready": True}), flush=True)
    while sub.poll(int(quiet_s * 1000)):
        got_topic, seq, payload = sub.recv_multipart()
        assert got_topic.decode() == topic, got_topic
        print(json.dumps(describe(int.from_bytes(seq, "big"), payload)), flush=True)


def replay(endpoint: str, first: int) -> None:
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart((b"", first.to_bytes(8, "big")))
    while True:
        _, topic, seq, payload = sock.recv_multipart()
        if seq == (-1).to_bytes(8, "big", signed=True):
            print(json.dumps({"end": True}), flush=True)
            return
        print(json.dumps(describe(int.from_bytes(seq, "big"), payload)), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--subscribe"]:
        subscribe(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif sys.argv[1:2] == ["--replay"]:
        replay(sys.argv[2], int(sys.argv[3]))
    else:
        for n, line in enumerate(sys.stdin):
            print(json.dumps(describe(n, bytes.fromhex(line.strip()))), flush=True)
