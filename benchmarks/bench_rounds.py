"""Admission round latency on the real runtime: an idle pipeline, then a loaded one.

    .venv/bin/python benchmarks/bench_rounds.py [--model smollm2] [--pp 2] [--rounds 15] [--requests 40]

idle    one short prompt at a time (32 tokens, nothing else running): each prompt is one round
        (probe, then lease with escrow and commit, over the rounds plane) and one wave, so the
        round's latency is the rounds plane's own cost: messages, wake-ups, the pools' work.
loaded  `--requests` prompts of 256 random tokens, 8 outstanding at a time (a closed loop),
        so that rounds run while every stage computes: what the stages' compute costs the
        rounds plane on a machine with as many cores as stages.

Prints the median and 90th percentile of the engine's own round latencies (leader's start of
the round to its outcome). Timings vary from run to run on a shared machine: compare builds
interleaved (e.g. a checkout of another commit on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

from wavepp.engine import Engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15, help="idle: prompts, one at a time")
    parser.add_argument("--requests", type=int, default=40, help="loaded: prompts, 8 outstanding")
    args = parser.parse_args()
    rng = random.Random(0)
    engine = Engine(args.model, pp=args.pp)
    try:
        vocab = engine.vocab_size
        prompt = lambda n: [rng.randrange(vocab) for _ in range(n)]   # noqa: E731
        engine.prefill([prompt(64)])                                   # warm up
        start = len(engine.stats().round_latencies_s)
        for _ in range(args.rounds):
            engine.prefill([prompt(32)])
        _report("idle", list(engine.stats().round_latencies_s)[start:], None)
        start = len(engine.stats().round_latencies_s)
        slots = threading.Semaphore(8)
        t0 = time.perf_counter()
        for _ in range(args.requests):
            slots.acquire()
            engine.submit(prompt(256)).add_done_callback(lambda _: slots.release())
        for _ in range(8):
            slots.acquire()
        _report("loaded", list(engine.stats().round_latencies_s)[start:], time.perf_counter() - t0)
    finally:
        engine.shutdown()


def _report(name: str, latencies: list[float], wall_s: float | None) -> None:
    if not latencies:
        print(f"{name}: no rounds recorded")
        return
    ms = sorted(1e3 * x for x in latencies)
    wall = f", {wall_s:.1f} s in all" if wall_s is not None else ""
    print(f"{name:>6}: {len(ms)} rounds, median {statistics.median(ms):.2f} ms, "
          f"p90 {ms[int(0.9 * (len(ms) - 1))]:.2f} ms{wall}")


if __name__ == "__main__":
    main()
