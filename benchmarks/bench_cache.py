"""Per-stage cache costs at scale: hint lookup (match) and one admission round on one stage.

    python benchmarks/bench_cache.py [--sizes 10000,100000,1000000] [--repeats 2000]

For each size, a pool of exactly that many blocks (block size 16) is filled with cached
chains of 256 blocks (4k tokens) that share 64-block prefixes in groups of eight, so the pool
is full: no block is free and every admission escrows evictable leaves (the tails of the
least recently used chains). Then, on prompts of 256 blocks of which 64-192 are cached:
  match       pool.match(hashes)                                the leader's hint lookup
  admit       match + lease + reserve + commit                  one stage's admission round
  release     pool.release(request)                              the undo (cancel + unpin)
Hashing the 4k-token prompt is timed once, separately (hash_blocks, numpy input).
Warm-up first; medians and p99 in microseconds.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time

import numpy as np

from wavepp.cache import BlockPool, hash_blocks
from wavepp.cli import comma_list

BLOCK_SIZE = 16
CHAIN_BLOCKS = 256  # 4k tokens
SHARED_BLOCKS = 64
CHAINS_PER_GROUP = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    sizes = [int(s) for s in comma_list(args.sizes)]
    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cpus; python {sys.version.split()[0]} ({platform.python_implementation()})")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 150_000, CHAIN_BLOCKS * BLOCK_SIZE)
    hash_us = [_time_us(lambda: hash_blocks(prompt, BLOCK_SIZE)) for _ in range(200)]
    print(f"hash_blocks, {len(prompt)} tokens: median {statistics.median(hash_us):.1f} us\n")
    header = (f"{'blocks':>9} {'build s':>8} {'MB':>6} | {'match med':>9} {'p99':>6} {'lookups':>7} | "
              f"{'admit med':>9} {'p99':>6} | {'release med':>11} {'p99':>6}")
    print(header)
    print("-" * len(header))
    for num_blocks in sizes:
        _run_size(num_blocks, args.repeats, rng)


def _run_size(num_blocks: int, repeats: int, rng: np.random.Generator) -> None:
    gc.collect()
    rss_before = _rss_mb()
    start = time.perf_counter()
    pool, chains = _filled_pool(num_blocks, rng)
    build_s = time.perf_counter() - start
    rss_mb = _rss_mb() - rss_before
    gc.collect()
    gc.freeze()  # the pool's objects are long-lived: keep the collector off them while timing
    probes = [_probe_hashes(chains, rng) for _ in range(64)]
    for hashes in probes[:16]:  # warm up
        pool.match(hashes)
    match_us, lookups = [], []
    for i in range(repeats):
        hashes = probes[i % len(probes)]
        match_us.append(_time_us(lambda: pool.match(hashes)))
        lookups.append(pool.match(hashes).num_lookups)
    admit_us, release_us = [], []
    num_rounds = max(repeats // 4, 50)
    for i in range(num_rounds + 10):
        hashes = probes[i % len(probes)]
        start = time.perf_counter()
        _admit(pool, i, hashes)
        admitted = time.perf_counter()
        pool.release(i)
        released = time.perf_counter()
        if i >= 10:  # the first ten are warm-up
            admit_us.append((admitted - start) * 1e6)
            release_us.append((released - admitted) * 1e6)
    pool.check_integrity() if num_blocks <= 100_000 else None
    gc.unfreeze()
    print(f"{num_blocks:>9} {build_s:>8.1f} {rss_mb:>6.0f} | "
          f"{_median(match_us):>9.1f} {_p99(match_us):>6.1f} {statistics.median(lookups):>7.0f} | "
          f"{_median(admit_us):>9.1f} {_p99(admit_us):>6.1f} | "
          f"{_median(release_us):>11.1f} {_p99(release_us):>6.1f}")


def _admit(pool: BlockPool, request_id: int, hashes: list[int]) -> None:
    """One stage's side of an admission round for a 256-block prompt."""
    num_leased = pool.match(hashes).num_blocks
    assert pool.lease(request_id, hashes, num_leased).ok
    assert pool.reserve(request_id, len(hashes) - num_leased).ok
    assert pool.commit(request_id, hashes[num_leased:]).ok


def _filled_pool(num_blocks: int, rng: np.random.Generator) -> tuple[BlockPool, list[list[int]]]:
    """A full pool of cached 256-block chains, built through the public API."""
    pool = BlockPool(num_blocks, BLOCK_SIZE)
    chains: list[list[int]] = []
    shared: list[int] = []
    request_id = -1
    while True:
        if len(chains) % CHAINS_PER_GROUP == 0:
            shared = hash_blocks(rng.integers(0, 150_000, SHARED_BLOCKS * BLOCK_SIZE), BLOCK_SIZE)
        tail_tokens = rng.integers(0, 150_000, (CHAIN_BLOCKS - SHARED_BLOCKS) * BLOCK_SIZE)
        hashes = shared + hash_blocks(tail_tokens, BLOCK_SIZE, parent=shared[-1])
        num_cached = pool.match(hashes).num_blocks
        num_free = pool.capacity().num_free
        if num_free == 0:
            return pool, chains
        if num_free < len(hashes) - num_cached:  # the last chain is shorter: fill every block
            hashes = hashes[: num_cached + num_free]
        request_id -= 1
        pool.lease(request_id, hashes, num_cached)
        pool.reserve(request_id, len(hashes) - num_cached)
        pool.commit(request_id, hashes[num_cached:])
        pool.materialize(request_id)
        pool.publish(request_id, len(hashes) * BLOCK_SIZE)
        pool.free(request_id)
        chains.append(hashes)


def _probe_hashes(chains: list[list[int]], rng: np.random.Generator) -> list[int]:
    """A 256-block prompt: a random cached chain's first 64-192 blocks, then new blocks."""
    chain = chains[int(rng.integers(len(chains) - 1))]  # not the last, maybe shorter, one
    num_cached = int(rng.integers(SHARED_BLOCKS, 3 * SHARED_BLOCKS + 1))
    new_tokens = rng.integers(0, 150_000, (CHAIN_BLOCKS - num_cached) * BLOCK_SIZE)
    return chain[:num_cached] + hash_blocks(new_tokens, BLOCK_SIZE, parent=chain[num_cached - 1])


def _time_us(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e6


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))]


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: peak RSS is the best we have
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    main()
