"""HostKVStore: a block's bytes, every pool's, go out of the stage's pools and back; the
host_kv_gib option and its checks."""

import argparse

import pytest
import torch

from wavepp.cli.args import add_engine_args, add_pipeline_args, engine_config
from wavepp.engine import EngineConfig
from wavepp.models.paged_pools import PagedPools
from wavepp.models.spec import StageSpec
from wavepp.models.spec.page_layout import CachePool, PageLayout, StatePool
from wavepp.runtime.host_kv import HostKVStore

LAYOUT = PageLayout("tiny", (CachePool("key", 6, (0, 1, 2)), CachePool("value", 6, (0, 1, 2))))


def _pools():
    pools = PagedPools(LAYOUT, StageSpec(1, 3, 3), num_blocks=8, block_size=4, dtype=torch.float32)
    for t in pools.tensors.values():  # [layers, blocks, block_size, width]
        t.copy_(torch.randn(t.shape))
    return pools


def test_a_block_round_trips_through_the_store():
    pools = _pools()
    block_bytes = 2 * (2 * 4 * 6 * 4)  # two pools x 2 layers x 4 tokens x 6 wide x fp32
    store = HostKVStore(pools, capacity_bytes=3 * block_bytes + 1)
    assert store.block_bytes == block_bytes and store.num_slots == 3
    before = {name: t.clone() for name, t in pools.tensors.items()}
    store.put(101, 2)
    store.put(102, 5)
    staged = store.stage([102, 101])
    store.drop(101)
    store.put(103, 0)  # takes 101's slot: the staged copy keeps 101's bytes
    for t in pools.tensors.values():
        t[:, [6, 7]] = 0.0
    store.load(staged, [6, 7])
    for name, t in pools.tensors.items():
        assert torch.equal(t[:, 6], before[name][:, 5])
        assert torch.equal(t[:, 7], before[name][:, 2])
        assert torch.equal(t[:, :6], before[name][:, :6])  # nothing else was written
    assert len(store) == 2
    store.clear()
    assert len(store) == 0


def test_states_go_to_the_host_and_back_and_a_full_store_refuses_a_put():
    hybrid = PageLayout("hybrid", LAYOUT.pools, (StatePool("recurrent", 8, (1,), True),))
    pools = PagedPools(hybrid, StageSpec(0, 3, 3), 8, 4, torch.float32, num_state_slots=3)
    for t in [*pools.tensors.values(), *pools.states.values()]:
        t.copy_(torch.randn_like(t))
    store = HostKVStore(pools, 2**20)
    before = {name: t.clone() for name, t in pools.states.items()}
    store.put_state(11, 0)
    store.put_state(12, 2)
    for t in pools.states.values():
        t.zero_()  # the slots are reused: the host copies must not change
    store.load_states(store.stage_states([12, 11]), [1, 0])
    for name, t in pools.states.items():
        assert torch.equal(t[1], before[name][2]) and torch.equal(t[0], before[name][0])
        assert not t[2].any()  # nothing else was written
    store.drop_state(11)
    with pytest.raises(KeyError):
        store.stage_states([11])
    blocks = {name: t.clone() for name, t in pools.tensors.items()}
    store.load(store.stage_blocks([1, 2]), [5, 6])
    for name, t in pools.tensors.items():
        assert torch.equal(t[:, 5:7], blocks[name][:, 1:3])
        assert torch.equal(t[:, :5], blocks[name][:, :5])
    store = HostKVStore(_pools(), capacity_bytes=1)
    with pytest.raises(ValueError, match="no free slot"):
        store.put(1, 0)


def test_the_option_is_checked():
    with pytest.raises(ValueError, match="host_kv_gib must be >= 0"):
        EngineConfig(host_kv_gib=-1.0)
    p = argparse.ArgumentParser()
    add_pipeline_args(p)
    add_engine_args(p)
    p.add_argument("--top-k", type=int, default=5)
    args = p.parse_args(["--host-kv-gib", "0.5"])
    assert engine_config(args, "m").host_kv_gib == 0.5
    assert EngineConfig().host_kv_gib == 0.0
