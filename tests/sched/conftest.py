import random

import pytest

from wavepp.sched import CostCoefficients, CostModel
from wavepp.sim import SimCosts


def linear_costs(
    per_token_s=1e-5,
    per_chunk_s=1e-4,
    per_wave_s=5e-4,
    attn_s=0.0,
    round_latency_s=0.0,
    round_item_s=0.0,
    round_msg_s=0.0,
    stage_scale=None,
):
    """Virtual costs for the harness: the same t(L, x) model on every stage (optionally scaled)."""
    model = CostModel(
        CostCoefficients(c_wave=per_wave_s, c0=per_chunk_s, g=0.0, b=per_token_s, a=attn_s)
    )

    def wave_seconds(stage_id, chunks):
        scale = stage_scale[stage_id] if stage_scale else 1.0
        return scale * model.wave_time(chunks)

    return SimCosts(
        wave_seconds=wave_seconds,
        round_latency_s=round_latency_s,
        round_item_s=round_item_s,
        round_msg_s=round_msg_s,
    )


def grouped_prompts(num_groups, per_group, prefix_len, suffix_len, vocab=1000, seed=0):
    """Groups of prompts sharing a seeded prefix, each with its own suffix; interleaved order."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, vocab) for _ in range(prefix_len)] for _ in range(num_groups)]
    prompts = []
    for _i in range(per_group):
        for g in range(num_groups):
            prompts.append(prefixes[g] + [rng.randrange(1, vocab) for _ in range(suffix_len)])
    return prompts


@pytest.fixture
def costs():
    return linear_costs()
