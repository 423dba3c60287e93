"""The shared KV tier end to end, over a real mooncake_master on loopback: a prefix one
replica computed comes to another from Mooncake Store, and the first token computed on it
matches transformers' own model code (fp32)."""

import multiprocessing
import random

import pytest
import torch
import transformers

from wavepp.engine import Engine

from ..eventually import eventually
from .helpers import VOCAB, assert_clean

pytestmark = pytest.mark.slow

PREFIX = 96  # 6 blocks of 16


def _engine(model_dir, address, metadata, **options):
    return Engine(
        str(model_dir),
        pp=2,
        dtype="float32",
        block_size=16,
        stage_num_blocks=[12, 12],
        profile_waves=False,
        kv_tier="mooncake-store",
        kv_tier_master=address,
        kv_tier_metadata=metadata,
        kv_tier_segment_gib=1 / 64,
        **options,
    )


def _replica_main(model_dir, address, metadata, prompts, results, stop):
    """Another replica (a process of its own: one pipeline per process): prefill `prompts`,
    hand back the results, keep serving its store segment until `stop`."""
    with _engine(model_dir, address, metadata) as engine:
        results.put([(r.ok, r.num_cached_tokens) for r in engine.prefill(prompts)])
        stop.wait(120)


class OtherReplica:
    """A replica in a process of its own; its stages' segments hold what it put in the store
    until it stops."""

    def __init__(self, model_dir, master, prompts):
        ctx = multiprocessing.get_context("spawn")
        self.results, self.stop = ctx.Queue(), ctx.Event()
        args = (str(model_dir), master.address, master.metadata, prompts, self.results, self.stop)
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


def test_a_prefix_another_replica_computed_comes_from_the_store(tiny, mooncake_master):
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
