"""Seeded synthetic workloads: the reuse shapes the benchmark and the simulator run.

Token ids are drawn uniformly in [1, vocab_size) from one numpy Generator per workload, so
the same arguments give the same prompts on every machine. Requests of a group share a
seeded prefix and each has its own suffix; groups are interleaved (request i belongs to
group i % num_groups), so the first request of each group finds nothing cached and the
others can reuse its prefix.
"""

from __future__ import annotations

import numpy as np

from wavepp.workloads.workload import Workload

DEFAULT_VOCAB = 32000


def cold(
    num_requests: int,
    prompt_len: int,
    *,
    vocab_size: int = DEFAULT_VOCAB,
    seed: int = 0,
    block_size: int = 16,
) -> Workload:
    """Independent random prompts: no shared prefixes (ideal hit rate ~0)."""
    _check_positive(num_requests=num_requests, prompt_len=prompt_len)
    rng = _rng(seed, vocab_size)
    prompts = [_draw(rng, prompt_len, vocab_size) for _ in range(num_requests)]
    return Workload(
        "cold",
        prompts,
        block_size,
        description=f"{num_requests} x {prompt_len} tokens, no shared prefix",
    )


def reuse(
    num_requests: int,
    num_groups: int,
    prompt_len: int,
    reuse_ratio: float = 0.9,
    *,
    vocab_size: int = DEFAULT_VOCAB,
    seed: int = 0,
    block_size: int = 16,
) -> Workload:
    """Groups sharing a prefix of round(reuse_ratio * prompt_len) tokens; own suffixes."""
    if not 0.0 <= reuse_ratio <= 1.0:
        raise ValueError(f"reuse_ratio must be in [0, 1], got {reuse_ratio}")
    _check_positive(num_requests=num_requests, num_groups=num_groups, prompt_len=prompt_len)
    prefix_len = round(reuse_ratio * prompt_len)
    prompts = _grouped(
        _rng(seed, vocab_size),
        range(num_requests),
        num_groups,
        prefix_len,
        prompt_len - prefix_len,
        vocab_size,
    )
    return Workload(
        "reuse",
        prompts,
        block_size,
        description=f"{num_requests} x {prompt_len} tokens, {num_groups} groups "
        f"sharing {prefix_len}",
    )


def short_suffix(
    num_requests: int,
    num_groups: int,
    prefix_len: int = 1536,
    suffix_len: int = 64,
    *,
    vocab_size: int = DEFAULT_VOCAB,
    seed: int = 0,
    block_size: int = 16,
) -> Workload:
    """The hard case for admission: a long shared prefix and a short suffix per request, so
    each request computes little and admission cadence bounds throughput."""
    _check_positive(num_requests=num_requests, num_groups=num_groups, suffix_len=suffix_len)
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    prompts = _grouped(
        _rng(seed, vocab_size), range(num_requests), num_groups, prefix_len, suffix_len, vocab_size
    )
    return Workload(
        "short_suffix",
        prompts,
        block_size,
        description=f"{num_requests} x ({prefix_len} shared + {suffix_len}), {num_groups} groups",
    )


def mixed(
    num_requests: int,
    num_groups: int,
    prompt_len: int,
    reuse_ratio: float = 0.9,
    warm_fraction: float = 0.75,
    *,
    vocab_size: int = DEFAULT_VOCAB,
    seed: int = 0,
    block_size: int = 16,
) -> Workload:
    """`warm_fraction` of the requests from `reuse` groups, the rest cold, interleaved evenly:
    request i is cold when floor((i + 1) * c) > floor(i * c), c = 1 - warm_fraction (with
    0.75 warm: requests 3, 7, 11, ... are cold)."""
    if not 0.0 <= warm_fraction <= 1.0:
        raise ValueError(f"warm_fraction must be in [0, 1], got {warm_fraction}")
    if not 0.0 <= reuse_ratio <= 1.0:
        raise ValueError(f"reuse_ratio must be in [0, 1], got {reuse_ratio}")
    _check_positive(num_requests=num_requests, num_groups=num_groups, prompt_len=prompt_len)
    rng = _rng(seed, vocab_size)
    c = 1.0 - warm_fraction
    is_cold = [int((i + 1) * c + 1e-9) > int(i * c + 1e-9) for i in range(num_requests)]
    prefix_len = round(reuse_ratio * prompt_len)
    warm = iter(
        _grouped(
            rng,
            range(num_requests - sum(is_cold)),
            num_groups,
            prefix_len,
            prompt_len - prefix_len,
            vocab_size,
        )
    )
    prompts = [_draw(rng, prompt_len, vocab_size) if cold_i else next(warm) for cold_i in is_cold]
    return Workload(
        "mixed",
        prompts,
        block_size,
        description=f"{num_requests} x {prompt_len} tokens, {warm_fraction:.0%} warm "
        f"({num_groups} groups sharing {prefix_len}), rest cold",
    )


def gsp(
    num_groups: int = 64,
    prompts_per_group: int = 16,
    system_prompt_len: int = 2048,
    question_len: int = 128,
    *,
    shuffle: bool = True,
    vocab_size: int = DEFAULT_VOCAB,
    seed: int = 0,
    block_size: int = 16,
) -> Workload:
    """SGLang's generated-shared-prefix benchmark (bench_serving `generated-shared-prefix`,
    defaults 64 groups x 16 prompts, 2048-token system prompt, 128-token question): each
    prompt is its group's system prompt followed by its own question, in group order, then
    shuffled as SGLang does (here with the seed)."""
    _check_positive(
        num_groups=num_groups, prompts_per_group=prompts_per_group, question_len=question_len
    )
    if system_prompt_len < 0:
        raise ValueError(f"system_prompt_len must be >= 0, got {system_prompt_len}")
    rng = _rng(seed, vocab_size)
    systems = [_draw(rng, system_prompt_len, vocab_size) for _ in range(num_groups)]
    prompts = [
        systems[g] + _draw(rng, question_len, vocab_size)
        for g in range(num_groups)
        for _ in range(prompts_per_group)
    ]
    if shuffle:
        prompts = [prompts[i] for i in rng.permutation(len(prompts))]
    return Workload(
        "gsp",
        prompts,
        block_size,
        description=f"{num_groups} groups x {prompts_per_group}, system "
        f"{system_prompt_len} + question {question_len}",
    )


def _grouped(rng, indices, num_groups: int, prefix_len: int, suffix_len: int, vocab: int):
    prefixes = [_draw(rng, prefix_len, vocab) for _ in range(num_groups)]
    return [prefixes[i % num_groups] + _draw(rng, suffix_len, vocab) for i in indices]


def _draw(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(1, vocab, size=n).tolist()


def _rng(seed: int, vocab_size: int) -> np.random.Generator:
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
    return np.random.default_rng(seed)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
