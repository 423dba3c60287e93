"""Synthetic workloads: exact sharing structure and ideal hit rates worked out by hand."""

import pytest

from wavepp.workloads import cold, gsp, ideal_hit_rate, make_workload, mixed, reuse, short_suffix


def test_ideal_hit_rate_counts_whole_chained_blocks_and_keeps_the_last_token():
    a = list(range(1, 9))  # 8 tokens: blocks [1..4] [5..8]
    # the second prompt extends the first by one token: both blocks reusable (cap (9-1)//4*4 = 8)
    assert ideal_hit_rate([a, a + [9]], 4) == pytest.approx(8 / 17)
    # a repeat is capped at one block short: the block holding the final token is recomputed
    assert ideal_hit_rate([a, a], 4) == pytest.approx(4 / 16)
    # same second block after a different first block: a different chain, nothing reusable
    assert ideal_hit_rate([a, [9, 9, 9, 9] + a[4:]], 4) == 0.0
    # a partial block is never shared
    assert ideal_hit_rate([a[:6], a[:6] + [7]], 4) == pytest.approx(4 / 13)


def test_cold_prompts_share_nothing():
    w = cold(5, 12, block_size=4, vocab_size=50, seed=1)
    assert [len(p) for p in w.prompts] == [12] * 5
    assert all(1 <= t < 50 for p in w.prompts for t in p)
    assert w.ideal_hit_rate == 0.0


def test_reuse_groups_share_the_prefix_and_not_the_suffix():
    w = reuse(6, 2, 10, reuse_ratio=0.8, block_size=4, seed=3)  # prefix 8 = two blocks
    p = w.prompts
    assert p[2][:8] == p[0][:8] and p[4][:8] == p[0][:8] and p[3][:8] == p[1][:8]
    assert p[0][:8] != p[1][:8]
    assert len({tuple(q[8:]) for q in p}) == 6
    # requests 0 and 1 are cold; 2..5 reuse min(8, (10-1)//4*4 = 8) tokens each
    assert w.ideal_hit_rate == pytest.approx(4 * 8 / 60)


def test_reuse_of_a_whole_prompt_is_capped_one_block_short():
    w = reuse(4, 1, 8, reuse_ratio=1.0, block_size=4)
    assert all(q == w.prompts[0] for q in w.prompts)
    assert w.ideal_hit_rate == pytest.approx(3 * 4 / 32)


def test_short_suffix_prefix_ending_mid_block_shares_only_whole_blocks():
    w = short_suffix(4, 1, prefix_len=6, suffix_len=3, block_size=4)
    assert all(q[:6] == w.prompts[0][:6] for q in w.prompts)
    # block [4, 8) mixes prefix and suffix tokens: only [0, 4) is reusable
    assert w.ideal_hit_rate == pytest.approx(3 * 4 / 36)


def test_mixed_interleaves_one_cold_request_in_four():
    w = mixed(8, 1, 8, reuse_ratio=0.5, warm_fraction=0.75, block_size=4, seed=2)
    p = w.prompts
    warm = [0, 1, 2, 4, 5, 6]
    assert all(p[i][:4] == p[0][:4] for i in warm)
    assert p[3][:4] != p[0][:4] and p[7][:4] != p[0][:4] and p[3] != p[7]
    # five warm requests after the first reuse one block each
    assert w.ideal_hit_rate == pytest.approx(5 * 4 / 64)


def test_gsp_matches_sglang_shape_and_shuffle_keeps_the_prompts():
    plain = gsp(2, 3, 8, 2, shuffle=False, block_size=4, seed=5)
    assert [q[:8] == plain.prompts[0][:8] for q in plain.prompts] == [True] * 3 + [False] * 3
    assert plain.ideal_hit_rate == pytest.approx(2 * 2 * 8 / 60)
    mixed_order = gsp(2, 3, 8, 2, shuffle=True, block_size=4, seed=5)
    assert sorted(mixed_order.prompts) == sorted(plain.prompts)
    # whatever the order, the first prompt seen of each group is the only cold one
    assert mixed_order.ideal_hit_rate == pytest.approx(plain.ideal_hit_rate)


@pytest.mark.parametrize("name", ["cold", "reuse", "short_suffix", "mixed", "gsp"])
def test_same_seed_same_prompts_other_seed_other_prompts(name):
    small = {"gsp": {"num_groups": 3, "prompts_per_group": 2, "system_prompt_len": 40}}.get(
        name, {"num_requests": 6}
    )
    a = make_workload(name, seed=7, **small)
    b = make_workload(name, seed=7, **small)
    c = make_workload(name, seed=8, **small)
    assert a.prompts == b.prompts and a.ideal_hit_rate == b.ideal_hit_rate
    assert a.prompts != c.prompts


def test_registry_rejects_unknown_names_and_parameters():
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("nope")
    with pytest.raises(ValueError, match="no parameter"):
        make_workload("cold", prefix_len=3)
    assert (
        make_workload("short-suffix", num_requests=3, prefix_len=32, suffix_len=4).num_tokens == 108
    )


def test_validation_names_the_field():
    with pytest.raises(ValueError, match="reuse_ratio"):
        reuse(4, 2, 10, reuse_ratio=1.5)
    with pytest.raises(ValueError, match="num_groups"):
        reuse(4, 0, 10)
