"""A stage's arena ledger (kv_transfer/mooncake/ledger.py): room oldest first, the table a decode
engine reads (a part's seq is zero before its bytes can change and set only once they are in
place), releases from outside, the TTL; and the decode side's plan over the params alone
(decode_plan.plan_arena): every refusal."""

from __future__ import annotations

import pytest
import torch

from wavepp.kv_transfer.decode_plan import plan_arena
from wavepp.kv_transfer.mooncake.ledger import MAGIC, ArenaFull, ArenaLedger
from wavepp.kv_transfer.mooncake.part import check_location, pack_layout, prompt_digest, read_plan


def test_room_goes_to_the_oldest_first_and_a_part_is_seen_only_once_written():
    ledger = ArenaLedger(capacity=1000, max_entries=8, ttl_s=60)
    assert list(ledger.table[0]) == [MAGIC, 0, 0, 1000]
    a = ledger.alloc(400, now=0)
    assert ledger.table[a.entry, 0] == 0  # reserved: a reader finds no seq yet
    ledger.commit(a)
    b = ledger.alloc(400, now=1)
    ledger.commit(b)
    assert ledger.table[a.entry, 0] == a.seq and (ledger.live_entries, ledger.live_bytes) == (
        2,
        800,
    )
    c = ledger.alloc(300, now=2)  # 800 + 300 > 1000: the ring wraps onto a, the oldest
    assert c.offset == 0 and ledger.table[a.entry, 0] == 0 and ledger.num_evicted == 1
    ledger.commit(c)
    assert ledger.table[b.entry, 0] == b.seq  # the newer one stays
    assert len({a.seq, b.seq, c.seq}) == 3
    with pytest.raises(ArenaFull, match="needs 1001 B; this stage's arena holds 1000 B"):
        ledger.alloc(1001, now=3)
    assert ledger.num_refused == 1 and ledger.table[b.entry, 0] == b.seq  # nothing evicted


def test_a_release_frees_only_the_part_it_names_and_the_ttl_frees_the_rest():
    ledger = ArenaLedger(capacity=1000, max_entries=8, ttl_s=10)
    a, b = ledger.alloc(100, 0), None
    ledger.commit(a)
    b = ledger.alloc(100, 5)
    ledger.commit(b)
    ledger.table[a.entry, 1] = a.seq + 1  # a stale release (another part's seq): ignored
    assert ledger.reclaim(6) == 0
    ledger.table[a.entry, 1] = a.seq  # the decode side's one write
    assert ledger.reclaim(6) == 1 and ledger.table[a.entry, 0] == 0 and ledger.num_released == 1
    assert ledger.reclaim(14.9) == 0 and ledger.reclaim(15) == 1 and ledger.num_expired == 1
    assert (ledger.live_entries, ledger.live_bytes, len(ledger)) == (0, 0, 0)


def test_a_full_table_gives_up_its_oldest_entry_and_a_cancelled_slot_is_never_seen():
    ledger = ArenaLedger(capacity=10_000, max_entries=2, ttl_s=60)
    slots = []
    for t in range(3):
        slots.append(ledger.alloc(64, t))
        ledger.commit(slots[-1])
    assert ledger.table[slots[0].entry, 0] == slots[2].seq  # the oldest entry went to the newest
    assert ledger.live_entries == 2 and ledger.num_evicted == 1
    d = ledger.alloc(64, 4)
    ledger.cancel(d)
    assert ledger.table[d.entry, 0] == 0 and ledger.live_entries == 1


def part(prompt, layers=(0, 1), width=8, pools=("key", "value"), block=16):
    """A stage's part as the arena lays it: whole blocks of `block` rows per layer."""
    rows_per_layer = -(-len(prompt) // block) * block
    rows = {
        p: (
            list(layers),
            torch.arange(len(layers) * rows_per_layer * width, dtype=torch.float32).view(
                len(layers), rows_per_layer, width
            )
            + 1000 * i,
        )
        for i, p in enumerate(pools)
    }
    nbytes, layout = pack_layout({p: (ls, t.shape, t.dtype) for p, (ls, t) in rows.items()})
    loc = {
        "session": "127.0.0.1:1",
        "stage": 0,
        "layers": [layers[0], layers[-1] + 1],
        "entry": 1,
        "seq": 7,
        "entry_addr": 0,
        "addr": 0,
        "nbytes": nbytes,
        "dtype": "float32",
        "num_tokens": len(prompt),
        "rows": rows_per_layer,
        "pools": layout,
    }
    return rows, loc


def test_the_read_plan_names_each_layers_run_of_tokens():
    prompt = list(range(10))  # 10 tokens in a block of 16: each layer's rows are 16 apart
    rows, loc = part(prompt)
    assert check_location(loc) is None and loc["rows"] == 16
    arena = torch.zeros(loc["nbytes"], dtype=torch.uint8)
    for name, (_, t) in rows.items():  # laid out as a stage lays it
        at = loc["pools"][name]["offset"]
        arena[at : at + t.nbytes].view(torch.float32).copy_(t.flatten())
    loc["addr"] = arena.data_ptr()
    local = torch.zeros(4096, dtype=torch.uint8)
    segments, views = read_plan(loc, 3, 9, local)
    assert len(segments) == 4  # one run per pool and layer
    for dst, src, n in segments:  # what the transfer engine does
        at, to = src - loc["addr"], dst - local.data_ptr()
        local[to : to + n].copy_(arena[at : at + n])
    for name, (_, t) in rows.items():
        assert torch.equal(views[name][1], t[:, 3:9])


def params_for(prompt, **kw):
    _, loc0 = part(prompt, layers=(0, 1), **kw)
    _, loc1 = part(prompt, layers=(2, 3), **kw)
    return {
        "transfer_id": "t",
        "num_tokens": len(prompt),
        "prompt_digest": prompt_digest(prompt),
        "stages": [loc0, loc1],
    }


@pytest.mark.parametrize(
    "case, needle",
    [
        ("other prompt", "another prompt"),
        ("no stages", "no stage parts"),
        ("bad address", "no valid 'addr'"),
        ("other width", "wide"),
        ("latent", "pools"),
        ("fewer layers", "covers 2 layers"),
        ("past its bytes", "reaches past"),
        ("fewer rows", "fewer rows than tokens"),
    ],
)
def test_params_that_cannot_serve_the_request_compute_it(case, needle):
    prompt = list(range(100, 140))
    params = params_for(
        prompt,
        width=16 if case == "other width" else 8,
        pools=("latent",) if case == "latent" else ("key", "value"),
    )
    if case == "other prompt":
        prompt = prompt[:-1] + [7]
    elif case == "no stages":
        params["stages"] = []
    elif case == "bad address":
        params["stages"][1]["addr"] = "0x10"
    elif case == "fewer layers":
        params["stages"] = params["stages"][:1]
    elif case == "past its bytes":
        params["stages"][0]["nbytes"] -= 4
    elif case == "fewer rows":
        params["stages"][0]["rows"] = len(prompt) - 1
    plan = plan_arena(params, prompt, num_computed=0, num_layers=4, kv_width=8)
    assert plan.num_tokens == 0 and needle in plan.reason


def test_params_that_fit_load_every_token_but_the_last():
    prompt = list(range(100, 140))
    params = params_for(prompt)
    assert plan_arena(params, prompt, num_computed=0, num_layers=4, kv_width=8).num_tokens == 39
    assert plan_arena(params, prompt, num_computed=32, num_layers=4, kv_width=8).num_tokens == 7
