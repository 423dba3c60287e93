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
        self.held, self.bad, self.loads = {}, set(), []

    def exists(self, keys):
        return [k in self.held for k in keys]

    def fetch(self, keys):
        if any(k not in self.held or k in self.bad for k in keys):
            return None
        return [self.held[k] for k in keys]

    def load(self, staged, block_ids):
        self.loads.append((tuple(staged), tuple(block_ids)))

    def put(self, keys, block_ids):
        for k, b in zip(keys, block_ids):
            self.held.setdefault(k, b)


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


def test_finished_blocks_go_to_the_store_and_another_stage_loads_them():
    store = DictStore()
    writer = _server(store)
    tokens = list(range(18))  # 4 full blocks and 2 tokens
    hint, result = _admit(writer, 1, tokens, 0)
    assert hint.num_blocks == 0 and result.ok
    _run(writer, 1, 0, 6, False)  # finishes block 0 only
    assert len(store.held) == 1
    _run(writer, 1, 6, 18, True, wave_id=1)  # blocks 1..3; the partial one is never stored
    keys = [writer.store_tier.key(h) for h in hash_blocks(tokens, BS)]
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
    store = DictStore()
    writer = _server(store)
    tokens = list(range(17))
    _admit(writer, 1, tokens, 0)
    _run(writer, 1, 0, 17, True)
    reader = _server(store)
    before = reader.pool.capacity()
    store.bad.add(writer.store_tier.key(hash_blocks(tokens, BS)[2]))
    hint, result = _admit(reader, 2, tokens, 4)
    assert hint.num_blocks == 4 and not result.ok and "store" in result.reason
    assert reader.pool.capacity() == before and not reader.requests
    assert reader.store_tier.num_refused_loads == 1 and not store.loads
    reader.pool.check_integrity()


def test_another_namespace_finds_nothing():
    store = DictStore()
    writer = _server(store)
    tokens = list(range(17))
    _admit(writer, 1, tokens, 0)
    _run(writer, 1, 0, 17, True)
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
