"""The routing policies (wavepp/route/replica_table.py, prefix_record.py), free of HTTP:
round-robin in turn, least-load by requests in flight, approx by the router's own record of
the prefixes it sent where, bounded by the balance slack; replicas that are down are skipped;
the record is bounded."""

from __future__ import annotations

import pytest

from wavepp.route.prefix_record import (
    TEXT_CHUNK,
    TOKEN_CHUNK,
    PrefixRecord,
    chunk_hashes,
    prompt_key,
)
from wavepp.route.replica_table import NoReplica, ReplicaTable, held_value

URLS = ["http://a", "http://b", "http://c"]


def test_round_robin_takes_the_healthy_replicas_in_turn():
    table = ReplicaTable(URLS, "round-robin")
    assert [table.choose("x").index for _ in range(4)] == [0, 1, 2, 0]
    table.set_healthy(1, False)
    assert [table.choose("x").index for _ in range(3)] == [2, 0, 2]
    table.set_healthy(1, True)
    assert table.choose("x").index == 0 or table.choose("x").index == 1


def test_least_load_takes_the_replica_with_the_fewest_in_flight():
    table = ReplicaTable(URLS, "least-load")
    table.started(0)
    table.started(0)
    table.started(2)
    assert table.choose("x").index == 1
    table.started(1)
    table.started(1)
    assert table.choose("x").index == 2
    table.finished(0)
    table.finished(0)
    assert table.choose("x").index == 0


def test_approx_sends_a_shared_prefix_where_it_went_before_within_the_balance_slack():
    table = ReplicaTable(URLS, "approx", balance_slack=3)
    prefix = list(range(100, 100 + 4 * TOKEN_CHUNK))
    first = table.choose(tuple(prefix + [1, 2]))
    assert first.reason == "least-load"  # nothing recorded anywhere yet
    table.started(first.index, tuple(prefix + [1, 2]))
    later = table.choose(tuple(prefix + [7, 8, 9]))
    assert later == type(later)(first.index, "prefix", 4)
    table.started(first.index)
    table.started(first.index)  # 3 in flight there, 0 elsewhere: past the slack
    crowded = table.choose(tuple(prefix + [5]))
    assert crowded.index != first.index and crowded.reason == "balance"
    other = table.choose(tuple(range(5000, 5000 + 3 * TOKEN_CHUNK)))  # shares nothing
    assert other.reason == "least-load" and other.index != first.index
    assert table.decisions == {"least-load": 2, "prefix": 1, "balance": 1}


def test_a_replica_that_went_down_forgets_what_it_was_sent():
    table = ReplicaTable(URLS, "approx")
    key = "a" * (3 * TEXT_CHUNK)
    table.started(2, key)
    assert table.choose(key).index == 2
    table.set_healthy(2, False)
    assert table.choose(key).index != 2
    table.set_healthy(2, True)
    assert len(table.replicas[2].record) == 0


def test_no_healthy_replica_is_refused_and_bad_options_are_named():
    table = ReplicaTable(URLS[:1], "least-load")
    table.set_healthy(0, False)
    with pytest.raises(NoReplica):
        table.choose("x")
    with pytest.raises(ValueError, match="cache, approx, least-load, round-robin"):
        ReplicaTable(URLS, "cache-aware")
    with pytest.raises(ValueError, match="at least one"):
        ReplicaTable([], "approx")


def test_prefix_keys_and_their_chained_chunks():
    assert prompt_key({"prompt": [1, 2, 3]}) == (1, 2, 3)
    assert prompt_key({"prompt": "hi"}) == "hi"
    chat = prompt_key({"messages": [{"role": "user", "content": "hi"}]})
    assert isinstance(chat, str) and "hi" in chat
    a = chunk_hashes("x" * (2 * TEXT_CHUNK) + "tail")
    b = chunk_hashes("x" * (2 * TEXT_CHUNK) + "other tail")
    c = chunk_hashes("y" + "x" * (2 * TEXT_CHUNK))
    assert len(a) == 2 and a == b and c[0] != a[0] and c[1] != a[1]  # chained: a change moves all
    record = PrefixRecord(max_prefixes=3)
    record.add(chunk_hashes(tuple(range(4 * TOKEN_CHUNK))))
    assert len(record) == 3  # bounded: the least recently sent went first
    assert record.match(chunk_hashes(tuple(range(4 * TOKEN_CHUNK)))) == 0  # its first chunk gone


def test_cache_counts_what_every_stage_holds_and_what_is_in_flight_there():
    table = ReplicaTable(URLS, "cache", balance_slack=3)
    key = tuple(range(4 * TOKEN_CHUNK))
    # replica 1 holds half of it on all its stages; replica 2 holds nothing yet, but a request
    # of the same prefix is in flight there
    ticket = table.started(2, key)
    choice = table.choose(key, cached={0: 0.0, 1: 0.5, 2: 0.0})
    assert (choice.index, choice.reason) == (2, "prefix")  # all four chunks queued there
    table.finished(2, 0, ticket)
    assert table.replicas[2].queued == {}  # what it had in flight is gone with it
    assert table.choose(key, cached={0: 0.0, 1: 0.5, 2: 0.0}).index == 1
    assert table.choose(key, cached={}).reason == "least-load"


def test_cache_prefers_pool_hits_then_host_then_store():
    """Three replicas each hold all 512 tokens of a prompt, in a different tier: the one with
    them in its pools wins, then the host tier, then the shared store; an answer without tiers
    counts as pool."""
    answers = [
        {"num_tokens": 512, "cached_tokens": 512, "tiers": {"pool": 0, "host": 0, "store": 512}},
        {"num_tokens": 512, "cached_tokens": 512, "tiers": {"pool": 0, "host": 512, "store": 0}},
        {"num_tokens": 512, "cached_tokens": 512, "tiers": {"pool": 512, "host": 0, "store": 0}},
    ]
    shares = {i: held_value(a) / 512 for i, a in enumerate(answers)}
    table = ReplicaTable(URLS, "cache", balance_slack=3)
    key = tuple(range(512))
    assert table.choose(key, cached=shares).index == 2
    del shares[2]
    assert table.choose(key, exclude=[2], cached=shares).index == 1
    assert held_value({"num_tokens": 512, "cached_tokens": 300}) == 300
    # more tokens in a lower tier still beat fewer in the pool
    assert held_value(answers[0]) > held_value({"cached_tokens": 300, "tiers": {"pool": 300}})
