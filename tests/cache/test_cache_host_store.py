"""HostTier with a store of the bytes: the store is told exactly what the tier's own LRU does
(puts with the evicted block's id, drops in LRU order), and nothing more."""

import pytest

from wavepp.cache import BlockPool, HostTier, InvalidArgumentError, hash_blocks

BS = 4
BLOCK_BYTES = 100


class FakeStore:
    def __init__(self):
        self.events = []
        self.held = {}  # hash -> block id it came from

    def put(self, block_hash, block_id):
        assert block_hash not in self.held
        self.events.append(("put", block_hash, block_id))
        self.held[block_hash] = block_id

    def drop(self, block_hash):
        self.events.append(("drop", block_hash))
        del self.held[block_hash]

    def stage(self, block_hashes):
        self.events.append(("stage", tuple(block_hashes)))
        return tuple(self.held[h] for h in block_hashes)

    def load(self, staged, block_ids):
        self.events.append(("load", staged, tuple(block_ids)))

    def put_state(self, block_hash, slot):
        self.events.append(("put_state", block_hash, slot))

    def drop_state(self, block_hash):
        self.events.append(("drop_state", block_hash))

    def stage_states(self, block_hashes):
        self.events.append(("stage_states", tuple(block_hashes)))
        return tuple(block_hashes)

    def load_states(self, staged, slots):
        self.events.append(("load_states", staged, tuple(slots)))

    def stage_blocks(self, block_ids):
        self.events.append(("stage_blocks", tuple(block_ids)))
        return tuple(block_ids)


def test_the_store_follows_the_lru_exactly():
    store = FakeStore()
    tier = HostTier(3 * BLOCK_BYTES, BLOCK_BYTES, store=store)
    for block_hash, block_id in ((10, 1), (11, 2), (12, 3)):
        tier.offload(block_hash, block_id=block_id)
    tier.offload(11, block_id=5)  # held: touched, nothing copied
    tier.offload(13, block_id=4)  # 10, the least recent, goes first
    tier.offload(14, block_id=6)  # then 12
    assert store.events == [
        ("put", 10, 1),
        ("put", 11, 2),
        ("put", 12, 3),
        ("drop", 10),
        ("put", 13, 4),
        ("drop", 12),
        ("put", 14, 6),
    ]
    assert list(tier._blocks) == [11, 13, 14] == list(store.held)
    tier.check_integrity()


def test_onboard_stages_at_once_and_land_writes_the_new_blocks():
    store = FakeStore()
    tier = HostTier(2 * BLOCK_BYTES, BLOCK_BYTES, store=store)
    tier.offload(20, block_id=0)
    tier.offload(21, block_id=1)
    load = tier.onboard([20, 21], 0)
    tier.offload(22, block_id=2)  # a victim of the load's own escrow: 20 is dropped meanwhile
    tier.land(load, [2, 3])
    assert store.events[2:] == [
        ("stage", (20, 21)),
        ("drop", 20),
        ("put", 22, 2),
        ("load", (0, 1), (2, 3)),  # the bytes staged before the drop
    ]
    with pytest.raises(InvalidArgumentError, match="2 blocks and 0 states loaded, 1 block ids"):
        tier.land(load, [7])


def test_with_a_store_an_offload_names_its_block():
    tier = HostTier(2 * BLOCK_BYTES, BLOCK_BYTES, store=FakeStore())
    with pytest.raises(InvalidArgumentError, match="needs its block_id"):
        tier.offload(30)


def test_eviction_puts_each_victim_with_the_block_it_leaves():
    store = FakeStore()
    pool = BlockPool(4, BS, host_tier=HostTier(100 * BLOCK_BYTES, BLOCK_BYTES, store=store))
    a = _cycle(pool, "a", list(range(16)))  # 4 cached blocks
    assert store.events == []
    _cycle(pool, "b", list(range(100, 108)))  # 2 blocks: a's two deepest leaves go
    assert store.events == [("put", a[3][0], a[3][1]), ("put", a[2][0], a[2][1])]
    pool.check_integrity()


def _cycle(pool, rid, tokens):
    """Cache `tokens` as a request would; returns (hash, block id) of each full block."""
    hashes = hash_blocks(tokens, BS)
    assert pool.lease(rid, hashes, 0).ok
    assert pool.reserve(rid, -(-len(tokens) // BS)).ok
    assert pool.commit(rid, hashes).ok
    table = pool.materialize(rid)
    pool.publish(rid, len(tokens))
    pool.free(rid)
    return list(zip(hashes, table))


def test_snapshots_follow_the_lru_with_their_slots():
    """A hybrid model's snapshots: put with the slot they leave (with their block, or alone
    before it), dropped with their entry, staged and landed into the slots given."""
    store = FakeStore()
    tier = HostTier(3 * BLOCK_BYTES, BLOCK_BYTES, snapshot_bytes=BLOCK_BYTES // 2, store=store)
    tier.offload_snapshot(40, slot=3)  # its block stays on the GPU for now
    tier.offload(40, has_snapshot=True, block_id=1, snapshot_slot=3)  # the block joins it
    tier.offload(41, has_snapshot=True, block_id=2, snapshot_slot=5)
    assert store.events == [
        ("put_state", 40, 3),
        ("put", 40, 1),
        ("put", 41, 2),
        ("put_state", 41, 5),
    ]
    assert tier.has_snapshot(40) and tier.has_snapshot(41) and not tier.has_snapshot(42)
    load = tier.onboard([41], 1, state_hashes=[41])
    tier.land(load, [6], state_slots=[0])
    assert store.events[-4:] == [
        ("stage", (41,)),
        ("stage_states", (41,)),
        ("load", (2,), (6,)),
        ("load_states", (41,), (0,)),
    ]
    tier.offload(42, block_id=3)  # 40 (block and state: 1.5 blocks) is the least recent
    assert ("drop", 40) in store.events and ("drop_state", 40) in store.events
    with pytest.raises(InvalidArgumentError, match="no snapshot after 40"):
        tier.onboard([], 1, state_hashes=[40])
    with pytest.raises(InvalidArgumentError, match="its snapshot's slot"):
        tier.offload(43, has_snapshot=True, block_id=4)
    tier.check_integrity()
