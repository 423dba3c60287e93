"""The decode side's decision (kv_transfer/decode_plan.py): what loads, and every way a transfer
is refused so that the decode engine computes the prompt instead; and the connector's
per-request planner, which reads and verifies a transfer once per request."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from wavepp.kv_transfer.decode_plan import LATENT_POOLS, DecodePlanner, plan_load
from wavepp.kv_transfer.directory import DirectoryStore

PROMPT = list(range(100, 170))  # 70 tokens


def write(
    store,
    transfer_id="t",
    prompt=PROMPT,
    stages=((0, 2), (2, 4)),
    width=32,
    pools=("key", "value"),
    parts=None,
):
    store.write_request(
        transfer_id, {"token_ids": prompt, "num_stages": len(stages), "block_size": 16}
    )
    for i, (start, end) in enumerate(stages[:parts]):
        store.write_part(
            transfer_id,
            i,
            b"tensors",
            {
                "layers": [start, end],
                "num_tokens": len(prompt),
                "pools": {p: {"layers": list(range(start, end)), "width": width} for p in pools},
            },
        )


def plan(store, transfer_id="t", prompt=PROMPT, **kw):
    args = dict(block_size=32, num_computed=0, num_layers=4, kv_width=32) | kw
    return plan_load(store, transfer_id, prompt, **args)


def test_every_token_but_the_last_whatever_the_block_size(tmp_path):
    store = DirectoryStore(tmp_path)
    write(store)
    assert plan(store).num_tokens == 69  # 70 - 1: the last block (of 32) partly filled
    assert plan(store, block_size=16).num_tokens == 69
    assert plan(store, block_size=128).num_tokens == 69  # vLLM's default on the CPU
    assert plan(store, prompt=PROMPT[:65]).num_tokens == 64  # a shorter prompt of the same prefix
    assert plan(store, prompt=PROMPT[:64]).num_tokens == 63  # the last one is computed
    assert plan(store, num_computed=32).num_tokens == 37  # past what the engine cached itself
    assert (
        plan(store, num_computed=69).num_tokens == 0 and plan(store, num_computed=69).reason == ""
    )


@pytest.mark.parametrize(
    "case, needle",
    [
        ("unknown", "missing"),
        ("bad id", "transfer id"),
        ("corrupt", "corrupt"),
        ("failed export", "stage 1 could not write its part: disk full"),
        ("other prompt", "not this request's"),
        ("longer prompt", "not this request's"),
        ("other width", "wide"),
        ("fewer layers", "layers"),
        ("latent pool", "pools"),
    ],
)
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


def test_an_mla_engine_loads_latents_of_its_width_only(tmp_path):
    """An MLA decode engine takes one `latent` pool per layer, kv_lora_rank + qk_rope_head_dim
    wide: a latent transfer of that width loads; K/V pools or another width are refused."""
    store = DirectoryStore(tmp_path)
    write(store, "latent", width=576, pools=LATENT_POOLS)
    write(store, "narrow", width=24, pools=LATENT_POOLS)
    write(store, "kv", width=576)
    mla = dict(kv_width=576, pools=LATENT_POOLS)
    assert plan(store, "latent", **mla).num_tokens == 69
    narrow, kv = plan(store, "narrow", **mla), plan(store, "kv", **mla)
    assert (
        narrow.num_tokens == 0
        and "its latent rows are 24 wide; this model's are 576" in narrow.reason
    )
    assert (
        kv.num_tokens == 0
        and "holds the pools ['key', 'value']; this model's layers take ['latent']" in kv.reason
    )
    assert planner(store, **mla).num_new_tokens("r", {"transfer_id": "latent"}, PROMPT, 0) == 69


def test_incomplete_asks_again_until_the_last_stage_wrote(tmp_path):
    store = DirectoryStore(tmp_path)
    write(store, parts=1)
    assert plan(store).num_tokens is None and "stage 1" in plan(store).reason
    store.write_part(
        "t",
        1,
        b"tensors",
        {
            "layers": [2, 4],
            "num_tokens": 70,
            "pools": {p: {"layers": [2, 3], "width": 32} for p in ("key", "value")},
        },
    )
    assert plan(store).num_tokens == 69


class Counting:
    """The store's reads and sha256 passes (what verifying a transfer costs)."""

    def __init__(self, store, monkeypatch):
        import hashlib

        from wavepp.kv_transfer.directory import store as store_module

        self.reads = self.hashes = 0
        read, sha256 = store.read, hashlib.sha256

        def counted_read(*args, **kwargs):
            self.reads += 1
            return read(*args, **kwargs)

        def counted_sha256(*args):
            self.hashes += 1
            return sha256(*args)

        monkeypatch.setattr(store, "read", counted_read)
        monkeypatch.setattr(store_module, "hashlib", SimpleNamespace(sha256=counted_sha256))


def planner(store, **kw):
    return DecodePlanner(store, **(dict(block_size=32, num_layers=4, kv_width=32) | kw))


def test_a_transfer_is_verified_once_per_request_however_often_it_is_asked(tmp_path, monkeypatch):
    store = DirectoryStore(tmp_path)
    write(store)
    count = Counting(store, monkeypatch)
    plans, params = planner(store), {"transfer_id": "t"}
    assert plans.num_new_tokens("r1", params, PROMPT, 0) == 69
    assert (count.reads, count.hashes) == (1, 2)  # two parts, each checksummed
    for _ in range(5):  # vLLM asking again, step after step
        assert plans.num_new_tokens("r1", params, PROMPT, 0) == 69
    assert plans.num_new_tokens("r1", params, PROMPT, 32) == 37  # what it cached itself since
    assert (count.reads, count.hashes) == (1, 2)
    assert (
        plans.num_new_tokens("r2", params, PROMPT, 0) == 69
    )  # another request verifies for itself
    assert (count.reads, count.hashes) == (2, 4)
    plans.forget("r1")  # loaded, or ended
    assert plans.num_new_tokens("r1", params, PROMPT, 0) == 69 and (count.reads, count.hashes) == (
        3,
        6,
    )
    plans.forget("r1")
    plans.forget("r2")
    assert len(plans) == 0


def test_a_refusal_is_decided_logged_and_counted_once(tmp_path, monkeypatch, caplog):
    store = DirectoryStore(tmp_path)
    write(store, parts=1)  # stage 1 still writing
    count = Counting(store, monkeypatch)
    now = [100.0]
    plans = planner(store, wait_s=5.0, clock=lambda: now[0])
    params = {"transfer_id": "t"}
    assert plans.num_new_tokens("r", params, PROMPT, 0) is None  # ask again
    now[0] += 4.9
    assert plans.num_new_tokens("r", params, PROMPT, 0) is None and plans.num_misses == 0
    now[0] += 0.2  # waited wait_s: compute the prompt
    assert plans.num_new_tokens("r", params, PROMPT, 0) == 0 and plans.num_misses == 1
    reads = count.reads
    for _ in range(3):
        assert plans.num_new_tokens("r", params, PROMPT, 0) == 0
    assert count.reads == reads and plans.num_misses == 1
    assert sum("computes its prompt" in r.message for r in caplog.records) == 1
    # a hand-off the prefill reports failed: refused at once, the store not read
    failed = {"transfer_id": "t", "error": "stage 1: [Errno 28] No space left on device"}
    assert plans.num_new_tokens("f", failed, PROMPT, 0) == 0
    assert count.reads == reads and plans.num_misses == 2
    assert "No space left on device" in caplog.records[-1].message
    assert plans.num_new_tokens("none", None, PROMPT, 0) == 0 and plans.num_misses == 2
    for request_id in ("r", "f", "none"):
        plans.forget(request_id)
    assert len(plans) == 0
