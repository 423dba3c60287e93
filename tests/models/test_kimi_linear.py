"""Kimi-Linear (KDA + MLA without RoPE + MoE) against transformers' kimi_linear, fp32.

Tolerance: 1e-4 absolute on logits of magnitude ~5. Our scan solves each 64-token chunk's
corrections with a triangular solve where the reference substitutes row by row, and a scan
split at a snapshot sums in another order than one unsplit scan: both are fp32 rounding,
amplified over 4 layers (measured: ~3e-5).
"""

from __future__ import annotations

import pytest
import torch

from wavepp.models import (
    ChunkSpec,
    StageBatch,
    load_model_config,
    load_stage_model,
    page_layout,
    stage_specs,
)
from wavepp.models.kernels import Kernels
from wavepp.random_checkpoint import make_model

BLOCK = 16
ATOL = 1e-4


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    # layers: KDA, KDA, MLA, KDA (PP = 3 puts a stage of KDA only and one of MLA only)
    return make_model(
        tmp_path_factory.mktemp("kimi") / "kimi", arch="kimi_linear", num_layers=4, seed=3
    )


@pytest.fixture(scope="module")
def reference(kimi):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(kimi, dtype=torch.float32).eval()
    prompt = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(prompt[None]).logits[0]
    return prompt, logits


class Chain:
    """The stages of one split, chained in-process; blocks and state slots given by the test."""

    def __init__(self, path, num_stages: int, kernels: Kernels | None = None) -> None:
        config = load_model_config(path)
        self.stages = [
            load_stage_model(path, spec, torch.float32)
            for spec in stage_specs(config.num_layers, num_stages)
        ]
        self.caches = [stage.new_kv_cache(32, BLOCK, num_state_slots=16) for stage in self.stages]
        self.kernels = kernels  # None: the defaults

    def run(self, chunk: ChunkSpec, tokens: torch.Tensor) -> torch.Tensor:
        batch = StageBatch.build([chunk], BLOCK)
        hidden = self.stages[0](
            batch,
            self.caches[0],
            input_ids=tokens,
            all_logits=len(self.stages) == 1,
            kernels=self.kernels,
        )
        for i, (stage, cache) in enumerate(zip(self.stages[1:], self.caches[1:]), start=1):
            hidden = stage(
                batch,
                cache,
                hidden_states=hidden,
                all_logits=i == len(self.stages) - 1,
                kernels=self.kernels,
            )
        return hidden


def test_config_and_layout(kimi):
    config = load_model_config(kimi)
    assert config.is_hybrid and not config.uses_rope
    assert [config.is_linear(i) for i in range(4)] == [True, True, False, True]
    layout = page_layout(config)
    assert layout.pool("latent").layers == (2,)
    # recurrent 4 heads x 16 x 16 fp32 + conv 3 taps x 3 x 64 channels (fp32 here) per KDA layer
    assert layout.bytes_per_snapshot(0, 4, 4) == 3 * (4 * 16 * 16 * 4 + 3 * 192 * 4)
    assert layout.bytes_per_snapshot(2, 3, 2) == 0
    assert layout.bytes_per_block(0, 2, BLOCK, 2) == 0


@pytest.mark.parametrize("num_stages", [1, 2, 3])
def test_chunks_resuming_from_snapshots_equal_the_full_forward(kimi, reference, num_stages):
    prompt, want = reference
    chain = Chain(kimi, num_stages)
    table = tuple(range(10))
    # chunk 1 saves at the boundaries 16 and 32 (slots 1, 2) and at its end 40 (slot 0);
    # chunk 2 goes on from slot 0 and saves at 48, 64 and 77; chunk 3 from 77
    plan = [
        (0, 40, None, ((16, 1), (32, 2), (40, 0))),
        (40, 37, 0, ((48, 3), (64, 4), (77, 5))),
        (77, 73, 5, ()),
    ]
    got = []
    for start, n, state_in, saves in plan:
        chunk = ChunkSpec(start, n, table, "a", state_in=state_in, state_saves=saves)
        got.append(chain.run(chunk, prompt[start : start + n]))
    torch.testing.assert_close(torch.cat(got), want, rtol=0, atol=ATOL)


def test_resume_at_every_boundary_equals_from_scratch(kimi, reference):
    """Request a computes 150 tokens saving a snapshot at every block boundary; request b, the
    same prompt, reuses a's blocks [0, k) and the snapshot at k * 16, and computes the rest."""
    prompt, want = reference
    chain = Chain(kimi, 2)
    boundaries = list(range(BLOCK, 150, BLOCK))  # 16, 32, ..., 144
    saves = tuple((p, i) for i, p in enumerate(boundaries))
    chain.run(ChunkSpec(0, 150, tuple(range(10)), "a", state_saves=saves), prompt)
    for k, position in enumerate(boundaries, start=1):
        # b: a's blocks for [0, position), its own from block 10 on
        table = tuple(range(k)) + tuple(range(10, 10 + 10 - k))
        chunk = ChunkSpec(position, 150 - position, table, "b", state_in=k - 1)
        got = chain.run(chunk, prompt[position:])
        torch.testing.assert_close(got, want[position:], rtol=0, atol=ATOL)


def test_a_snapshot_from_another_position_changes_the_logits(kimi, reference):
    """The check above can fail: resuming at 32 from the snapshot taken at 16 is wrong."""
    prompt, want = reference
    chain = Chain(kimi, 1)
    chain.run(ChunkSpec(0, 40, tuple(range(10)), "a", state_saves=((16, 0), (32, 1))), prompt[:40])
    got = chain.run(ChunkSpec(32, 118, tuple(range(10)), "b", state_in=0), prompt[32:])
    assert (got - want[32:]).abs().max() > 1e-2


def test_resume_without_a_state_is_refused(kimi):
    chain = Chain(kimi, 1)
    with pytest.raises(ValueError, match="no state_in"):
        chain.run(ChunkSpec(16, 4, (0, 1), "a"), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="state_saves"):
        ChunkSpec(16, 4, (0, 1), "a", state_saves=((16, 0),))


def test_engine_pp2_reuses_snapshots_and_matches_transformers(kimi):
    """The real pipeline (one process per stage) with a snapshot every 2 blocks of 4 tokens:
    first tokens and logprobs as transformers computes them, cold and over reused snapshots."""
    import random

    import transformers

    from wavepp.engine import Engine

    rng = random.Random(4)
    prefixes = [[rng.randrange(256) for _ in range(rng.randrange(20, 40))] for _ in range(2)]
    prompts = [
        p + [rng.randrange(256) for _ in range(rng.randrange(1, 12))]
        for p in prefixes
        for _ in range(3)
    ]
    prompts.append(list(prompts[0]))
    model = transformers.AutoModelForCausalLM.from_pretrained(kimi, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = [model(torch.tensor([p])).logits[0, -1].log_softmax(-1) for p in prompts]
    with Engine(
        str(kimi),
        pp=2,
        dtype="float32",
        block_size=4,
        stage_num_blocks=[64, 48],
        snapshot_interval_blocks=2,
    ) as engine:
        first = engine.prefill(prompts)
        again = engine.prefill(prompts)
    for results in (first, again):
        for r, lp, p in zip(results, reference, prompts):
            assert r.ok, r.error
            assert r.first_token_id == int(lp.argmax())
            assert abs(r.first_token_logprob - float(lp.max())) < ATOL
            assert r.num_cached_tokens % 4 == 0 and r.num_cached_tokens < len(p)
    assert all(r.num_cached_tokens > 0 for r in again)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_simulator_charges_snapshots_from_the_runtime_layout(kimi, dtype):
    """The simulator's Kimi-Linear shape keeps the cache bytes per token and the snapshot bytes
    of the runtime's page layout (and the tensors the runtime allocates), and charges a chunk's
    snapshot copies at those bytes."""
    import json

    from wavepp.sim.cost.hardware import HARDWARE
    from wavepp.sim.cost.model_shapes import ModelShape
    from wavepp.sim.cost.stage_cost import StageCostModel

    shape = ModelShape.from_hf(
        json.loads((kimi / "config.json").read_text()), kv_bytes=dtype.itemsize
    )
    layout = page_layout(load_model_config(kimi))
    size = dtype.itemsize
    assert [shape.kv_bytes_per_token(i) for i in range(4)] == [
        layout.bytes_per_token(i, size) for i in range(4)
    ]
    for start, end in [(0, 4), (0, 2), (2, 3), (3, 4)]:
        assert sum(shape.snapshot_bytes(i) for i in range(start, end)) == layout.bytes_per_snapshot(
            start, end, size
        )
    model = load_stage_model(kimi, dtype=dtype)
    cache = model.new_kv_cache(3, 4, num_state_slots=5)
    assert cache.num_bytes == 3 * 4 * layout.bytes_per_block(
        0, 4, 1, size
    ) + 5 * layout.bytes_per_snapshot(0, 4, size)
    hw = next(iter(HARDWARE.values()))
    cost = StageCostModel(shape, hw, 0, 4, snapshot_interval_tokens=64)
    # resume at 100 (1 load), cross 128 and 192 (2 saves), save at the end 200: 4 copies
    want = 4 * layout.bytes_per_snapshot(0, 4, size) / hw.hbm_bytes_s
    assert cost.breakdown([(100, 100)])["snapshots"] == pytest.approx(want)
    assert "snapshots" not in StageCostModel(shape, hw, 0, 4).breakdown([(100, 100)])


def test_engine_aligns_chunks_and_resets_to_another_snapshot_grid(kimi):
    """Alignment on (the default): first tokens equal transformers', and every cut chunk long
    enough to move (>= 32 tokens: its tolerance is a block) ends on a snapshot boundary. Engine.reset to
    another interval moves every stage to the new grid: a prompt sharing a prefix with an
    earlier one reuses exactly the new grid's ideal, and the caches check clean."""
    import random

    import transformers

    from wavepp.engine import Engine
    from wavepp.workloads.workload import snapshot_reusable_tokens

    rng = random.Random(5)
    long_prompts = [
        [rng.randrange(256) for _ in range(rng.randrange(100, 200) | 1)] for _ in range(6)
    ]
    prefix = [rng.randrange(256) for _ in range(30)]
    shared = [
        prefix + [i] + [rng.randrange(256) for _ in range(rng.randrange(3, 15))] for i in range(4)
    ]
    model = transformers.AutoModelForCausalLM.from_pretrained(kimi, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = {
            tuple(p): model(torch.tensor([p])).logits[0, -1].log_softmax(-1)
            for p in long_prompts + shared
        }

    def check(results, prompts):
        for r, p in zip(results, prompts):
            assert r.ok, r.error
            lp = reference[tuple(p)]
            assert r.first_token_id == int(lp.argmax())
            assert abs(r.first_token_logprob - float(lp.max())) < ATOL

    lengths = {len(p) for p in long_prompts}
    with Engine(
        str(kimi),
        pp=2,
        dtype="float32",
        block_size=4,
        stage_num_blocks=[160, 120],
        snapshot_interval_blocks=2,
    ) as engine:
        assert engine._core.leader.planner.config.snapshot_interval_blocks == 2
        check(engine.prefill(long_prompts), long_prompts)
        cuts = [
            (L, x)
            for stage, shapes, _ in engine.stats().stage_samples
            if stage == 0
            for L, x in shapes
            if L + x not in lengths
        ]
        # a snapshot boundary: a grid point, or a prompt's last reusable boundary
        boundaries = {(n - 1) // 4 * 4 for n in lengths}
        assert all((L + x) % 8 == 0 or L + x in boundaries for L, x in cuts if x >= 32), cuts
        for interval in (4, 2):
            engine.reset(snapshot_interval_blocks=interval)
            assert engine._core.leader.planner.config.snapshot_interval_blocks == interval
            results = [engine.prefill([p])[0] for p in shared]  # one at a time: reuse in this order
            check(results, shared)
            want = snapshot_reusable_tokens(shared, 4, interval)
            assert [r.num_cached_tokens for r in results] == list(want)
            for report in engine.check_integrity():
                assert report.capacity.num_blocks > 0
    # 31 shared tokens: 7 common blocks; grid 4 resumes at 16 tokens, grid 2 at 24
    assert list(snapshot_reusable_tokens(shared, 4, 4))[1:] == [16] * 3
    assert list(snapshot_reusable_tokens(shared, 4, 2))[1:] == [24] * 3
