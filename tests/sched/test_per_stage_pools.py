"""Per-stage pools of different sizes, through the whole pipeline in virtual time.

A request reuses the prefix cached on every stage. When the small stage has evicted part of a
chain the large stage still holds, the next request that extends that chain computes it again
on every stage; the large stage must then keep the extension too, or a later request finds
the small stage holding more than the large one, and reuses less than either holds."""

import random

from wavepp.sim import build_sim, run_closed_loop

from .conftest import linear_costs

BS = 16


def scenario_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)

    def fresh(n):
        return [rng.randrange(1, 1000) for _ in range(n)]

    x, y = fresh(16 * BS), fresh(8 * BS)
    flush = [fresh(12 * BS) for _ in range(3)]  # 36 blocks: x leaves the small stage
    return [x + fresh(BS), *flush, x + y + fresh(BS // 2), x + y + fresh(BS // 2)]


def run(stage_num_blocks):
    sim = build_sim(
        "wavepp",
        2,
        linear_costs(),
        stage_num_blocks=stage_num_blocks,
        block_size=BS,
        check_integrity=True,
    )
    report = run_closed_loop(sim, scenario_prompts(), 1, "wavepp")
    assert report.num_failed == 0
    return [sim.records[i].num_cached_tokens for i in range(len(sim.records))]


def test_a_larger_stage_keeps_the_chain_a_request_recomputed():
    big, small = run([4096, 40]), run([40, 40])
    # request 4 finds x whole on the large stage only (the small one kept its first 4 blocks),
    # so it computes the rest of x and y on every stage; request 5 then reuses x + y on both
    # stages (before, the large stage kept x alone, and request 5 reused 256 tokens with the
    # large stage and 384 with two small ones)
    assert big[4] == small[4] == 4 * BS
    assert big[5] == small[5] == 24 * BS
    assert big == small
