"""Our batches, decoded by vLLM's own classes (KVEventBatch, BlockStored, BlockRemoved,
AllBlocksCleared) in its venv: the fields it reads are the ones we mean; a chain goes as one
BlockStored, a run of removals as one BlockRemoved."""

import json
import subprocess
from pathlib import Path

import pytest

from wavepp.kv_events import AllCleared, RemovedBlock, StoredBlock
from wavepp.kv_events.wire import encode_batch

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
DECODE = Path(__file__).with_name("vllm_decode.py")
needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="no vLLM venv (.venv-vllm): `make test` makes it"
)


def vllm_decode(payloads: list[bytes]) -> list[dict]:
    out = subprocess.run(
        [str(VLLM_PYTHON), str(DECODE)],
        input="".join(p.hex() + "\n" for p in payloads),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@needs_vllm
def test_vllm_decodes_our_batches():
    big = 2**64 - 3  # hashes are unsigned 64-bit
    events = [
        StoredBlock(big, None, (1, 2, 3, 4)),
        StoredBlock(7, big, (5, 6, 7, 8)),  # the previous block's child: the same BlockStored
        StoredBlock(9, 3, (9, 9, 9, 9)),  # another chain: a new one
        RemovedBlock(7),
        RemovedBlock(big),
        AllCleared(),
    ]
    batches = vllm_decode([encode_batch(12.5, events, 4), encode_batch(13.0, [], 4)])
    assert batches[0]["ts"] == 12.5 and batches[0]["dp_rank"] == 0
    common = {"block_size": 4, "lora_id": None, "lora_name": None, "medium": "GPU"}
    assert batches[0]["events"] == [
        {"type": "stored", "block_hashes": [big, 7], "parent": None, **common}
        | {"token_ids": [1, 2, 3, 4, 5, 6, 7, 8]},
        {"type": "stored", "block_hashes": [9], "parent": 3, "token_ids": [9] * 4, **common},
        {"type": "removed", "block_hashes": [7, big], "medium": "GPU"},
        {"type": "cleared"},
    ]
    assert batches[1]["events"] == []


VLLM_ENCODE = """
import msgspec, sys
from vllm.distributed.kv_events import (
    AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch,
)
events = [
    BlockStored(block_hashes=[2**64 - 3, 7], parent_block_hash=None,
                token_ids=[1, 2, 3, 4, 5, 6, 7, 8], block_size=4, lora_id=None,
                medium="GPU", lora_name=None),
    BlockRemoved(block_hashes=[7], medium="GPU"),
    AllBlocksCleared(),
]
sys.stdout.write(msgspec.msgpack.Encoder().encode(KVEventBatch(ts=2.25, events=events,
                                                               data_parallel_rank=0)).hex())
"""


@needs_vllm
def test_our_bytes_are_the_bytes_vllm_encodes():
    out = subprocess.run(
        [str(VLLM_PYTHON), "-c", VLLM_ENCODE],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    ours = encode_batch(
        2.25,
        [
            StoredBlock(2**64 - 3, None, (1, 2, 3, 4)),
            StoredBlock(7, 2**64 - 3, (5, 6, 7, 8)),
            RemovedBlock(7),
            AllCleared(),
        ],
        4,
    )
    assert ours.hex() == out.stdout.strip().splitlines()[-1]
