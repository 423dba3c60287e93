"""The start-up profiling pass: every stage times waves of varied shape on its own model slice
and cache, and the leader fits its planner's cost model to the slowest stage's times.

Waves of uniform chunks cannot separate a wave's fixed cost from a chunk's and a token's (they
all grow together), so the pass runs the mix `profile_wave_shapes` gives: one and four chunks,
from a block to the largest wave, after no prefix and after prefixes of 1x and 4x the largest
wave (`fit_coefficients` then picks the knee as well). The stages profile in parallel, each on
its own core, so the pass costs what the slowest stage's takes (seconds for SmolLM2 at PP = 2,
see the README; milliseconds for the tiny test models).

Nothing of the pass stays in the cache: it writes its new tokens' KV into blocks no request
owns yet (the pool is empty at start-up) and reads prefix blocks that were never written, which
costs the same as reading cached ones. Hybrid models (recurrent state slots) are not profiled:
their planner starts from the default cost model and fits online as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from wavepp.models import ChunkSpec, StageBatch
from wavepp.runtime.device import synchronize
from wavepp.sched.cost_model import CostCoefficients, fit_coefficients

Shape = tuple[tuple[int, int], ...]  # a wave: (num_cached, num_new) per chunk

# the largest wave the pass times: the runtime's largest wave (PlannerConfig.max_wave_tokens)
PROFILE_MAX_WAVE_TOKENS = 512
MIN_PROFILE_SHAPES = 8  # fewer shapes fit the cache or the model's positions: no fit


@dataclass(frozen=True)
class ProfileWaves:
    """Leader -> stage, once, before any request: time these waves, answer ProfileTimes."""

    shapes: tuple[Shape, ...]


@dataclass(frozen=True)
class ProfileTimes:
    stage_id: int
    seconds: tuple[float, ...]  # one per shape, in order


@dataclass(frozen=True)
class WaveProfile:
    """What the pass measured and what the planner starts from."""

    shapes: tuple[Shape, ...]
    stage_seconds: tuple[tuple[float, ...], ...]  # [stage][shape]
    coefficients: CostCoefficients  # fitted to the slowest stage per shape
    wall_s: float

    @property
    def slowest(self) -> list[float]:
        return [max(per_stage) for per_stage in zip(*self.stage_seconds)]

    def describe(self) -> str:
        """One line: the pass and the fitted cost model, in milliseconds."""
        c = self.coefficients
        return (
            f"{len(self.shapes)} waves on {len(self.stage_seconds)} stage(s) in {self.wall_s:.1f} s; "
            f"planner starts from t = {c.c_wave * 1e3:.2f} ms/wave + {c.c0 * 1e3:.2f} ms/chunk + "
            f"{c.g * 1e6:.3f} us/cached token + {c.b * 1e3:.3f} ms/token + "
            f"{c.a * 1e9:.2f} ns x (2Lx + x^2), knee {c.knee_tokens:.0f} tokens"
        )


def profile_shapes(
    block_size: int,
    max_positions: int,
    num_blocks: int,
    max_wave_tokens: int = PROFILE_MAX_WAVE_TOKENS,
) -> tuple[Shape, ...]:
    """The pass's waves: the mix of `profile_wave_shapes` (one and four chunks after no prefix
    and prefixes of M and 4M) at every other size (M, M/4, M/16: 18 waves, enough to separate
    the terms). M is `max_wave_tokens`, or the largest power of two below it whose waves fit
    the model's positions and the smallest stage's pool (each chunk its own blocks, prefix
    included); () if M would fall under four blocks."""
    m = 1 << (max(1, max_wave_tokens).bit_length() - 1)

    def blocks(L: int, x: int, n: int) -> int:
        return n * -(-(L + x) // block_size)

    while m >= 4 * block_size and (
        5 * m > max_positions
        or blocks(4 * m, m, 1) > num_blocks
        or blocks(4 * m, m // 4, 4) > num_blocks
    ):
        m //= 2
    if m < 4 * block_size:
        return ()
    out = []
    for L in (0, m, 4 * m):
        for x in (m, m // 4, m // 16):
            for n in (1, 4):
                chunks = ((L, max(block_size, x // n // block_size * block_size)),) * n
                if chunks not in out:
                    out.append(chunks)
    return tuple(out)


def fit_profile(
    shapes: Sequence[Shape], stage_seconds: Sequence[Sequence[float]], wall_s: float = 0.0
) -> WaveProfile:
    """Fit the cost model to the slowest stage's time of each wave (the pipeline's pace)."""
    if not stage_seconds or any(len(s) != len(shapes) for s in stage_seconds):
        raise ValueError("every stage must report one time per profiled wave")
    slowest = [max(per_stage) for per_stage in zip(*stage_seconds)]
    coef = fit_coefficients(list(zip([list(s) for s in shapes], slowest)))
    return WaveProfile(tuple(shapes), tuple(tuple(s) for s in stage_seconds), coef, wall_s)


def time_stage_waves(
    stage, shapes: Sequence[Shape], *, repeat: int = 2, seed: int = 0
) -> tuple[float, ...]:
    """Run each wave of `shapes` through `stage` (a StageRuntime) on synthetic inputs and
    return its compute seconds: the fastest of `repeat` runs, since other work on the machine
    only ever adds time. One untimed warm-up wave first (allocator, first-call costs)."""
    if not shapes:
        return ()
    gen = torch.Generator().manual_seed(seed)
    bs = stage.config.engine.block_size
    kernels = stage.kernel_choice.kernels

    def run(chunks: Shape) -> float:
        return time_wave(stage.model, stage.kv, chunks, bs, gen, kernels)

    with stage.lock:
        run(shapes[0])
        return tuple(min(run(chunks) for _ in range(max(1, repeat))) for chunks in shapes)


def time_wave(
    model, kv, chunks: Shape, block_size: int, gen: torch.Generator, kernels=None
) -> float:
    """Seconds of one forward of `model` (a StageModel) over the wave `chunks` on synthetic
    inputs (random token ids on a first stage, a random residual stream on the others), its
    cache rows written into `kv` from block 0 on (which must hold them). A hybrid model's
    chunks after a prefix start from state slot 0."""
    specs, next_block = [], 0
    hybrid = model.layout.is_hybrid
    for i, (L, x) in enumerate(chunks):
        n = -(-(L + x) // block_size)
        blocks = tuple(range(next_block, next_block + n))
        state_in = 0 if hybrid and L else None
        specs.append(ChunkSpec(L, x, blocks, request_id=f"profile-{i}", state_in=state_in))
        next_block += n
    device = model.device
    batch = StageBatch.build(specs, block_size).to(device)
    inputs = _wave_inputs(model, sum(x for _, x in chunks), gen)
    synchronize(device)  # a GPU's queue holds only this wave's work when the clock starts
    t0 = time.perf_counter()
    model(batch, kv, kernels=kernels, **inputs)
    synchronize(device)
    return time.perf_counter() - t0


def profile_pipeline(
    stage, channels, stage_num_blocks: Sequence[int], max_positions: int
) -> WaveProfile | None:
    """Rank 0's side of the pass: every stage (`stage` here, the others over `channels`) times
    the same waves at once; the fit is to the slowest stage. None where it does not apply
    (hybrid models) or too few waves fit the cache."""
    if stage.layout.is_hybrid:
        return None
    shapes = profile_shapes(stage.config.engine.block_size, max_positions, min(stage_num_blocks))
    if len(shapes) < MIN_PROFILE_SHAPES:
        return None
    t0 = time.perf_counter()
    num_stages = len(stage_num_blocks)
    for rank in range(1, num_stages):
        channels.send_obj(ProfileWaves(shapes), rank, "rounds")
    seconds = [time_stage_waves(stage, shapes)]
    seconds += [channels.recv_obj(rank, "replies").detail.seconds for rank in range(1, num_stages)]
    return fit_profile(shapes, seconds, time.perf_counter() - t0)


def _wave_inputs(model, num_tokens: int, gen: torch.Generator) -> dict:
    """A first stage's input ids, or another stage's hidden states: [num_tokens, input_width],
    the residual stream random, the columns past it (DSA's top-k positions) 0: position 0."""
    config = model.config
    if model.stage.is_first:
        ids = torch.randint(0, config.vocab_size, (num_tokens,), generator=gen)
        return {"input_ids": ids.to(model.device)}
    h = torch.zeros(num_tokens, model.input_width, dtype=model.dtype)
    h[:, : config.hidden_size] = torch.randn(num_tokens, config.hidden_size, generator=gen).to(
        model.dtype
    )
    return {"hidden_states": h.to(model.device)}
