"""The decode side's decision (kv_transfer/decode_plan.py): what loads, and every way a transfer
is refused so that the decode engine computes the prompt instead."""

from __future__ import annotations

import pytest

from wavepp.kv_transfer import DirectoryStore
from wavepp.kv_transfer.decode_plan import plan_load

PROMPT = list(range(100, 170))          # 70 tokens


def write(store, transfer_id="t", prompt=PROMPT, stages=((0, 2), (2, 4)), width=32, pools=("key", "value"),
          parts=None):
    store.write_request(transfer_id, {"token_ids": prompt, "num_stages": len(stages), "block_size": 16})
    for i, (start, end) in enumerate(stages[:parts]):
        store.write_part(transfer_id, i, b"tensors", {
            "layers": [start, end], "num_tokens": len(prompt),
            "pools": {p: {"layers": list(range(start, end)), "width": width} for p in pools}})


def plan(store, transfer_id="t", prompt=PROMPT, **kw):
    args = dict(block_size=32, num_computed=0, num_layers=4, kv_width=32) | kw
    return plan_load(store, transfer_id, prompt, **args)


def test_whole_blocks_and_never_the_last_token(tmp_path):
    store = DirectoryStore(tmp_path)
    write(store)
    assert plan(store).num_tokens == 64                           # (70 - 1) // 32 * 32
    assert plan(store, block_size=16).num_tokens == 64
    assert plan(store, prompt=PROMPT[:65]).num_tokens == 64       # a shorter prompt of the same prefix
    assert plan(store, prompt=PROMPT[:64]).num_tokens == 32       # 64 tokens: the last one is computed
    assert plan(store, num_computed=32).num_tokens == 32          # past what the engine cached itself
    assert plan(store, num_computed=64).num_tokens == 0 and plan(store, num_computed=64).reason == ""


@pytest.mark.parametrize("case, needle", [
    ("unknown", "missing"),
    ("bad id", "transfer id"),
    ("corrupt", "corrupt"),
    ("failed export", "stage 1 could not write its part: disk full"),
    ("other prompt", "not this request's"),
    ("longer prompt", "not this request's"),
    ("other width", "wide"),
    ("fewer layers", "layers"),
    ("latent pool", "pools"),
])
def test_refusals_compute_the_prompt(tmp_path, case, needle):
    store = DirectoryStore(tmp_path)
    if case == "other width":
        write(store, width=48)
    elif case == "fewer layers":
        write(store, stages=((0, 2), (2, 3)))
    elif case == "latent pool":
        write(store, pools=("latent",))
    else:
        write(store)
    prompt = PROMPT
    if case == "corrupt":
        (tmp_path / "t" / "stage1.safetensors").write_bytes(b"tensorz")
    if case == "failed export":
        store.mark_failed("t", {1: "disk full"})
    if case == "other prompt":
        prompt = [1] + PROMPT[1:]
    if case == "longer prompt":
        prompt = PROMPT + [5, 6]
    transfer_id = {"unknown": "nope", "bad id": "../t"}.get(case, "t")
    result = plan(store, transfer_id, prompt)
    assert result.num_tokens == 0 and needle in result.reason


def test_incomplete_asks_again_until_the_last_stage_wrote(tmp_path):
    store = DirectoryStore(tmp_path)
    write(store, parts=1)
    assert plan(store).num_tokens is None and "stage 1" in plan(store).reason
    store.write_part("t", 1, b"tensors", {"layers": [2, 4], "num_tokens": 70,
                                          "pools": {p: {"layers": [2, 3], "width": 32} for p in ("key", "value")}})
    assert plan(store).num_tokens == 64
