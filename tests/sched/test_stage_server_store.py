"""A stage with the shared store below its pool: the hint counts the store's run, a lease past
the pool fetches it (and holds nothing when the fetch fails), and every full block a chunk
finishes goes to the store. The store here is a dict (the runtime's is Mooncake Store)."""

from wavepp.cache import BlockPool, hash_blocks
from wavepp.cache.store_tier import StoreTier
from wavepp.sched.messages import Chunk, LeaseItem, LeaseMsg, ProbeItem, ProbeMsg, Wave
from wavepp.sched.stage_server import StageServer

BS = 4


class DictStore:
    """Keys -> the block id they were put from; `bad`: keys whose fetch fails (a checksum)."""

    def __init__(self):
        self.held, self.bad, self.loads, self.fetches, self.exists_calls = {}, set(), [], 0, 0

    def exists(self, keys):
        self.exists_calls += 1
        return [k in self.held for k in keys]

    def fetch(self, keys):
        self.fetches += 1
        if any(k not in self.held or k in self.bad for k in keys):
            return None
        return [self.held[k] for k in keys]

    def load(self, staged, block_ids):
        self.loads.append((tuple(staged), tuple(block_ids)))

    def put(self, keys, block_ids):
        for k, b in zip(keys, block_ids):
            self.held.setdefault(k, b)

    def clear(self, prefix):
        self.held = {k: b for k, b in self.held.items() if not k.startswith(prefix)}


def _server(store, num_blocks=16):
    return StageServer(0, BlockPool(num_blocks, BS), StoreTier("ns/l0-2", 64, store))


def _admit(server, request_id, tokens, agreed, round_id=0):
    hashes = tuple(hash_blocks(tokens, BS))
    hint = server.probe(ProbeMsg(round_id, (ProbeItem(request_id, hashes, len(tokens)),)))
    new = -(-len(tokens) // BS) - agreed
    reply = server.lease(LeaseMsg(round_id, (LeaseItem(request_id, agreed, new),)))
    return hint.hints[0], reply.results[0]


def _run(server, request_id, start, end, last, wave_id=0):
    wave = Wave(wave_id, (Chunk(request_id, start, end, last),))
    server.prepare(wave)
    server.complete(wave)


def _written(tokens):
    """A store and the stage that computed `tokens` into it (request 1, one chunk)."""
    store = DictStore()
    writer = _server(store)
    _admit(writer, 1, tokens, 0)
    _run(writer, 1, 0, len(tokens), True)
    return store, writer


def test_finished_blocks_go_to_the_store_and_another_stage_loads_them():
    store = DictStore()
    writer = _server(store)
    tokens = list(range(18))  # 4 full blocks and 2 tokens
    hint, result = _admit(writer, 1, tokens, 0)
    assert hint.num_blocks == 0 and result.ok
    _run(writer, 1, 0, 6, False)  # finishes block 0 only
    assert len(store.held) == 1
    _run(writer, 1, 6, 18, True, wave_id=1)  # blocks 1..3; the partial one is never stored
    keys = [writer.tiers.store.key(h) for h in hash_blocks(tokens, BS)]
    assert sorted(store.held) == sorted(keys)

    reader = _server(store)  # another replica's stage with the same layers: an empty pool
    again = tokens[:16] + [99, 98, 97]
    hint, result = _admit(reader, 7, again, 4)
    assert (hint.num_blocks, hint.num_store_blocks) == (4, 4) and result.ok
    table = reader.requests[7].block_table
    assert store.loads == [(tuple(store.held[k] for k in keys), tuple(table[:4]))]
    assert reader.requests[7].num_cached_tokens == 16
    assert reader.counters().store_loaded_blocks == 4
    reader.pool.check_integrity()


def test_a_failed_fetch_refuses_the_lease_and_holds_nothing():
    tokens = list(range(17))
    store, writer = _written(tokens)
    reader = _server(store)
    before = reader.pool.capacity()
    store.bad.add(writer.tiers.store.key(hash_blocks(tokens, BS)[2]))
    hint, result = _admit(reader, 2, tokens, 4)
    assert hint.num_blocks == 4 and not result.ok and "store" in result.reason
    assert reader.pool.capacity() == before and not reader.requests
    assert reader.tiers.store.num_refused_loads == 1 and not store.loads
    reader.pool.check_integrity()


def test_another_namespace_finds_nothing():
    tokens = list(range(17))
    store, writer = _written(tokens)
    other = StageServer(0, BlockPool(16, BS), StoreTier("ns/l0-3", 64, store))
    hint, _ = _admit(other, 2, tokens, 0)
    assert hint.num_blocks == 0 and hint.num_store_blocks == 0


def test_the_store_counts_after_the_pool():
    """A prompt whose first blocks are in this stage's pool and the rest only in the store: the
    hint is the sum, split by tier; the lease leases the pool part and loads the rest."""
    store = DictStore()
    writer, reader = _server(store), _server(store)
    tokens = list(range(25))  # 6 full blocks
    _admit(writer, 1, tokens, 0)
    _run(writer, 1, 0, 25, True)
    _admit(reader, 2, tokens[:9], 0)  # the reader computes the first 2 blocks itself
    _run(reader, 2, 0, 9, True)
    hint, result = _admit(reader, 3, tokens, 6, round_id=1)
    assert (hint.num_blocks, hint.num_store_blocks) == (6, 4) and result.ok
    assert len(store.loads[-1][1]) == 4


def test_a_lease_uses_the_bytes_prefetched_before_the_lock():
    """The runtime fetches a lease's store bytes before it takes the stage lock (prefetch);
    the lease then fetches nothing more, unless its range moved since the probe."""
    tokens = list(range(25))
    store, writer = _written(tokens)
    reader = _server(store)
    hashes = tuple(hash_blocks(tokens, BS))
    reader.probe(ProbeMsg(0, (ProbeItem(2, hashes, 25),)))
    msg = LeaseMsg(0, (LeaseItem(2, 6, 1),))
    prefetched = reader.prefetch(msg)
    assert set(prefetched) == {2} and prefetched[2][:2] == (0, 6) and store.fetches == 1
    assert reader.handle(msg, prefetched).results[0].ok
    assert store.fetches == 1 and reader.counters().store_loaded_blocks == 6

    # the range moved: the reader's pool now holds the first 2 blocks (it computed them)
    other = _server(store)
    _admit(other, 3, tokens[:9], 0)
    _run(other, 3, 0, 9, True)
    other.probe(ProbeMsg(1, (ProbeItem(4, hashes, 25),)))
    msg = LeaseMsg(1, (LeaseItem(4, 6, 1),))
    stale = {4: (0, 6, store.fetch([other.tiers.store.key(h) for h in hashes[:6]]))}
    assert other.handle(msg, stale).results[0].ok
    assert len(store.loads[-1][1]) == 4  # fetched again: blocks [2, 6)


def test_a_reset_clears_the_namespace():
    store, writer = _written(list(range(17)))
    store.held["ns/l2-4/0000000000000001"] = 0  # another stage's
    writer.tiers.store.clear()
    assert list(store.held) == ["ns/l2-4/0000000000000001"]


def test_a_probe_uses_what_the_store_said_before_the_lock():
    tokens = list(range(25))
    store, writer = _written(tokens)
    reader = _server(store)
    msg = ProbeMsg(0, (ProbeItem(2, tuple(hash_blocks(tokens, BS)), 25),))
    store.exists_calls = 0
    held = reader.prefetch(msg)
    assert held == {2: [True] * 6} and store.exists_calls == 1
    hint = reader.handle(msg, held).hints[0]
    assert (hint.num_blocks, hint.num_store_blocks) == (6, 6) and store.exists_calls == 1
    # what it was told is what it counts: a store that lost block 3 since
    hint = reader.handle(msg, {2: [True, True, True, False, True, True]}).hints[0]
    assert hint.num_store_blocks == 3
