"""The shared KV tier end to end, over a real mooncake_master on loopback: a prefix one
replica computed comes to another from Mooncake Store, and the first token computed on it
matches transformers' own model code (fp32)."""

import multiprocessing
import random
import time

import pytest
import torch
import transformers

from wavepp.cache import hash_blocks
from wavepp.engine import Engine
from wavepp.random_checkpoint import make_model

from ..eventually import eventually
from .helpers import VOCAB, assert_clean

pytestmark = pytest.mark.slow

PREFIX = 96  # 6 blocks of 16


def _engine(model_dir, address, metadata, **options):
    settings = {
        "pp": 2,
        "dtype": "float32",
        "block_size": 16,
        "stage_num_blocks": [12, 12],
        "profile_waves": False,
        "kv_tier": "mooncake-store",
        "kv_tier_master": address,
        "kv_tier_metadata": metadata,
        "kv_tier_segment_gib": 1 / 64,
    }
    return Engine(str(model_dir), **{**settings, **options})


def _replica_main(model_dir, address, metadata, prompts, results, stop, options):
    """Another replica (a process of its own: one pipeline per process): prefill `prompts`,
    hand back the results, keep serving its store segment until `stop`."""
    with _engine(model_dir, address, metadata, **options) as engine:
        results.put([(r.ok, r.num_cached_tokens) for r in engine.prefill(prompts)])
        stop.wait(120)


class OtherReplica:
    """A replica in a process of its own; its stages' segments hold what it put in the store
    until it stops."""

    def __init__(self, model_dir, master, prompts, **options):
        ctx = multiprocessing.get_context("spawn")
        self.results, self.stop = ctx.Queue(), ctx.Event()
        args = (
            str(model_dir),
            master.address,
            master.metadata,
            prompts,
            self.results,
            self.stop,
            options,
        )
        self.process = ctx.Process(target=_replica_main, args=args)

    def __enter__(self):
        self.process.start()
        return self

    def prefilled(self, timeout_s: float = 120):
        return self.results.get(timeout=timeout_s)

    def __exit__(self, *exc):
        self.stop.set()
        self.process.join(60)
        if self.process.is_alive():
            self.process.kill()


def _reference(model_dir, prompt):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model.eval()(torch.tensor([prompt])).logits[0, -1].float()
    return torch.log_softmax(logits, -1)


def _assert_matches(result, ref):
    top = torch.topk(ref, len(result.top_logprobs))
    assert result.first_token_id == int(top.indices[0])
    assert [i for i, _ in result.top_logprobs] == top.indices.tolist()
    for (_, lp), want in zip(result.top_logprobs, top.values.tolist()):
        assert abs(lp - want) <= 1e-4, (lp, want)


@pytest.fixture(scope="module")
def mla_moe(tmp_path_factory):
    """DeepSeek-V3's family at test size: latent attention (one latent pool and one rope
    pool per layer, not K and V) and MoE layers."""
    return make_model(tmp_path_factory.mktemp("mla") / "deepseek", arch="deepseek_v3", seed=6)


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_a_prefix_another_replica_computed_comes_from_the_store(
    family, tiny, mla_moe, mooncake_master
):
    tiny = tiny if family == "llama" else mla_moe
    rng = random.Random(4)
    prefix = [rng.randrange(VOCAB) for _ in range(PREFIX)]
    first = prefix + [rng.randrange(VOCAB) for _ in range(10)]
    again = prefix + [rng.randrange(VOCAB) for _ in range(9)]
    master = mooncake_master
    with (
        OtherReplica(tiny, master, [first]) as writer,
        _engine(tiny, master.address, master.metadata) as reader,
    ):
        assert writer.prefilled() == [(True, 0)]
        # the writer's stages put its blocks beside the compute loop: wait until both hold them
        assert eventually(
            lambda: reader.cached_prefix([again])[0].cached_tokens == PREFIX, timeout_s=20
        )
        result = reader.prefill([again])[0]
        assert result.ok and result.num_cached_tokens == PREFIX
        assert_clean(reader)
    _assert_matches(result, _reference(tiny, again))

    # a replica with another layer split keys its stages' blocks otherwise: it finds nothing
    with _engine(tiny, master.address, master.metadata, layer_split=[1, 3]) as other:
        result = other.prefill([again])[0]
        assert result.ok and result.num_cached_tokens == 0
        names = {c.counters.store_namespace for c in other.stage_cache_counters()}
        assert len(names) == 2 and all(n.endswith(("/l0-1", "/l1-4")) for n in names)


def _counters(engine, stage):
    c = engine.stage_cache_counters()[stage].counters
    return c, dict(c.store)


def test_a_corrupt_store_entry_is_refused_and_computed(tiny, mooncake_master):
    """Bytes changed inside one entry of stage 1: its lease is refused, the request goes on
    with the blocks before it from the store and computes the rest; its tokens stay right."""
    from mooncake.store import MooncakeDistributedStore

    rng = random.Random(5)
    prefix = [rng.randrange(VOCAB) for _ in range(PREFIX)]
    again = prefix + [rng.randrange(VOCAB) for _ in range(9)]
    master = mooncake_master
    tamper = MooncakeDistributedStore()
    assert (
        tamper.setup("127.0.0.1", master.metadata, 16 << 20, 16 << 20, "tcp", "", master.address)
        == 0
    )
    with (
        OtherReplica(tiny, master, [prefix + [1, 2, 3]]) as writer,
        _engine(tiny, master.address, master.metadata) as reader,
    ):
        assert writer.prefilled() == [(True, 0)]
        assert eventually(
            lambda: reader.cached_prefix([again])[0].cached_tokens == PREFIX, timeout_s=20
        )
        namespace = _counters(reader, 1)[0].store_namespace
        key = f"{namespace}/{hash_blocks(prefix, 16)[2]:016x}"  # stage 1's third block
        value = bytearray(tamper.get(key))
        value[-5] ^= 0x40  # one bit of the payload
        # (a read leases the entry for a few seconds: the remove waits that out)
        assert eventually(lambda: tamper.remove(key) == 0, timeout_s=15, poll_s=0.2)
        assert tamper.put(key, bytes(value)) == 0
        result = reader.prefill([again])[0]
        assert result.ok and result.num_cached_tokens == 2 * 16  # the blocks before the bad one
        counters, backend = _counters(reader, 1)
        assert backend["corrupt"] == 1 and counters.store_refused_loads == 1
        assert counters.store_loaded_blocks == 2
        assert_clean(reader)
    tamper.close()
    _assert_matches(result, _reference(tiny, again))


def test_the_master_killed_mid_run_costs_only_its_hits(tiny, mooncake_master):
    """Requests go on while the master is down (computed, nothing fails); when it is back
    (empty: a master keeps its entries in memory), what is computed from then on is a hit
    again once the pools lost it (pools of 12 blocks)."""
    rng = random.Random(6)
    master = mooncake_master
    prefix, later = ([rng.randrange(VOCAB) for _ in range(PREFIX)] for _ in range(2))
    fillers = [[rng.randrange(VOCAB) for _ in range(100)] for _ in range(4)]
    with _engine(tiny, master.address, master.metadata) as engine:
        assert engine.prefill([prefix + [7]])[0].ok
        master.kill()
        down = engine.prefill([prefix[:50] + f for f in fillers] + [prefix + [8]])
        assert all(r.ok for r in down)
        assert _counters(engine, 0)[1]["reachable"] == 0
        master.start()
        time.sleep(2.5)  # the client's back-off (retry_s) passes
        assert engine.prefill([later + [9]])[0].ok
        for f in fillers:  # the pools lose `later`; the store, back, keeps it
            assert engine.prefill([f + [5]])[0].ok
        assert eventually(
            lambda: engine.cached_prefix([later + [10]])[0].cached_tokens == PREFIX,
            timeout_s=20,
        )
        result = engine.prefill([later + [10]])[0]
        assert result.ok and result.num_cached_tokens == PREFIX
        counters, backend = _counters(engine, 0)
        assert counters.store_loaded_blocks == PREFIX // 16 and backend["reachable"] == 1
        assert backend["dropped_puts"] > 0  # what was computed while it was down
        assert_clean(engine)


def test_a_reset_empties_the_store_too(tiny, mooncake_master):
    """POST /debug/reset and the bench's runs start from empty caches: the store's part of
    them (this namespace) goes too, leased entries included."""
    rng = random.Random(7)
    master = mooncake_master
    prefix = [rng.randrange(VOCAB) for _ in range(PREFIX)]
    fillers = [[rng.randrange(VOCAB) for _ in range(100)] for _ in range(4)]
    with _engine(tiny, master.address, master.metadata) as engine:
        assert engine.prefill([prefix + [1]])[0].ok
        for f in fillers:
            assert engine.prefill([f])[0].ok
        assert eventually(
            lambda: engine.cached_prefix([prefix + [2]])[0].tier_tokens == (0, 0, PREFIX),
            timeout_s=20,
        )
        engine.reset("wavepp")
        assert engine.cached_prefix([prefix + [2]])[0].cached_tokens == 0
        result = engine.prefill([prefix + [2]])[0]
        assert result.ok and result.num_cached_tokens == 0


def test_kimi_linear_resumes_from_states_another_replica_put(tmp_path, mooncake_master):
    """A hybrid model (Kimi-Linear): the other replica puts its blocks and the recurrent
    states it saved at block boundaries; this one, its pools empty, resumes at the deepest
    boundary whose state the store holds, and its first tokens are transformers'."""
    kimi = make_model(tmp_path / "kimi", arch="kimi_linear", num_layers=4, seed=3)
    rng = random.Random(10)
    prefix = [rng.randrange(VOCAB) for _ in range(40)]  # 10 blocks of 4
    first = prefix + [rng.randrange(VOCAB) for _ in range(5)]
    again = [prefix + [rng.randrange(VOCAB) for _ in range(n)] for n in (3, 7)]
    options = {
        "block_size": 4,
        "stage_num_blocks": [64, 64],
        "snapshot_interval_blocks": 2,
    }
    master = mooncake_master
    with (
        OtherReplica(kimi, master, [first], **options) as writer,
        _engine(kimi, master.address, master.metadata, **options) as reader,
    ):
        assert writer.prefilled() == [(True, 0)]
        assert eventually(
            lambda: reader.cached_prefix([again[0]])[0].cached_tokens == 40, timeout_s=20
        )
        results = reader.prefill(again)
        counters = [c.counters for c in reader.stage_cache_counters()]
        assert_clean(reader)
    assert all(r.ok and r.num_cached_tokens == 40 for r in results), results
    assert all(c.store_loaded_blocks > 0 for c in counters)
    model = transformers.AutoModelForCausalLM.from_pretrained(kimi, dtype=torch.float32).eval()
    for r, prompt in zip(results, again):
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1].float(), -1)
        _assert_matches(r, ref)
