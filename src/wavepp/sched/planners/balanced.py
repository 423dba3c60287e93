"""The balanced planner: waves sized by a fitted cost model from all the work in the system."""

from __future__ import annotations

import math
from typing import Sequence

from wavepp.sched.cost_model import CostModel
from wavepp.sched.messages import Chunk
from wavepp.sched.planners.balanced_rules import ALL_RULES, BalancedRules
from wavepp.sched.planners.base import (
    NOTHING_ADMITTING,
    Admitting,
    PlannerConfig,
    chunk_of,
    first_tokens,
)
from wavepp.sched.planners.snapshot_align import align_chunk_ends
from wavepp.sched.request import Request


class BalancedPlanner:
    """Waves sized by a fitted cost model from all the work in the system, in flight included.

    The pipeline wants `target_waves` waves in flight (default: one per stage), each carrying
    an equal share of all the work in the system: the work waiting (W, predicted chunk time of
    every plannable request's rest, and of every request waiting for or in an admission round,
    at its agreed prefix or, before the round agrees one, at none) and the work in flight (F,
    the chunks of the waves this planner sent that have not come back). The wave's time is

        T = c_wave + (W + F) / target_waves

    clamped as below; a wave never holds more than M tokens (`wave_tokens`: 2M behind a deep
    queue). Packing is FCFS: a request that fits in what is left of T goes whole, else it gets
    the largest block-aligned chunk that does. Two modes (`PlannerConfig.fill_waves`): equal
    times (the CPU runtime, M = 512) caps T so that every wave costs about the same; filling
    waves (the simulator's GPUs, M the efficient size from the profiling pass) lets the token
    cap bind: on a GPU a chunk cut short after a long prefix pays its per-chunk costs (MLA
    re-expansion of the prefix) and the per-wave weight reads again for fewer tokens.

    Each rule below is a switch of `rules` (BalancedRules; all on by default), named by what it
    fixes. The numbers are wavepp's input tokens/s with the rule off over all rules on, on the
    simulator's paper grid (GLM-5 and MiniMax-M2, PP4 B300, 40 settings) and kimi grid (Kimi-K2,
    PP8 B300, 36 settings), from benchmarks/ablate_planner.py
    (docs/benchmarks/2026-12-02-planner-ablation.md); "highest" counts settings where wavepp is
    the fastest policy (30/40 and 15/36 with every rule on). Rules of the equal-times mode
    alone do nothing on the simulator; their numbers come from tests/sched/test_harness.py's
    CPU-like case (2 stages, M = 512) until the runtime ablation (`--runtime`) is run.

    The share
      count_admitting   W counts the requests in or waiting for an admission round: without
                        them the first request of a burst spreads over S thin waves while the
                        rest is being admitted. Off: paper highest 30 -> 15, 13 settings lose
                        over 0.5%, worst -4.7% (MiniMax-M2 reuse c = 8); kimi unchanged.
      count_in_flight   F counts: with waves in flight the next takes its share of the whole,
                        not of what is left, so a few requests beside full waves do not split
                        into ever thinner waves and a burst does not go out (and come back) as
                        one lump. Off: paper highest 30 -> 0, geomean 0.931, worst -25.9%
                        (MiniMax-M2 reuse c = 8); kimi 11 settings lose, worst -7.6%.
    Holding a thin wave back (under `hold_frac` of a share waiting: send nothing)
      hold_when_full    with `target_waves` in flight: the next wave back brings more work,
                        and one fuller wave costs less than two thin ones. Off: paper 8
                        settings lose, worst -5.3% (MiniMax-M2 reuse c = 8); kimi unchanged.
      hold_for_round    with fewer in flight while a round runs that ends before a wave of its
                        own would cost more than one wave with it (the round's requests count
                        in the share): in a closed loop at low concurrency a thin wave sent
                        beside every round splits every wave. Off: paper highest 30 -> 25, 10
                        settings lose, worst -3.8% (MiniMax-M2 reuse c = 16).
    Clamps on T
      min_wave_floor    T >= a b_min-token wave: with little work the share alone sends waves
                        whose fixed costs dominate. Grids unchanged; test_harness's case -3.7%
                        (c = 1), and wavepp falls under 0.95x static there at c = 4.
      first_tokens_cap  equal times: T <= the first M tokens at hand, packed FCFS (the wave a
                        fixed M-token budget sends; a cap of one M-token chunk cut waves of many
                        short chunks below M). Grids and test_harness unchanged: kept for the
                        runtime ablation to decide (tests/sched/test_planner.py pins it).
      overhead_cap      equal times: T <= the wave's fixed costs (its own, and per chunk the
                        overhead plus re-reading the mean cached prefix) / `overhead_frac`:
                        chunks after long prefixes get fewer tokens, every wave costs about the
                        same. Grids unchanged; test_harness -7.1% at c = 4 (+3.6% at c = 64).
    2M waves (filling waves)
      double_deep_queue 2M tokens once the work waiting fills `deep_queue_waves` waves of 2M
                        per stage: a queue that deep amortizes the longer fill and drain, and
                        the per-wave costs halve. Off: kimi within-2% 26 -> 18 of 36, 13
                        settings lose, worst -10.2% (cold-256k c = 32); paper worst -3.0%.
      cap_double_at_longest  ... no longer than the longest wave since the pipeline last
                        drained, or an M-token wave now: through S stages waves of times t_i
                        finish after sum(t_i) + (S - 1) max(t_i) (a proportionate flow shop),
                        so a wave outlasting all the others costs S - 1 times its excess. Off:
                        kimi 5 settings lose, worst -4.2% (reuse-256k c = 4); paper gains up to
                        +1.4% (GLM-5 short-suffix c = 128), worst -0.4%.
    Which chunks
      cold_first        filling waves, fewer than `target_waves` in flight and nothing cached
                        in any ready request: those with nothing sent yet go first (a wave of
                        chunks from an empty prefix is the cheapest, so the stages downstream
                        start sooner; with a warm request ready the order stays FCFS, as
                        results feed a closed loop). Off: kimi 3 settings lose, worst -2.2%
                        (cold-256k c = 2); paper highest 30 -> 26.
      tail_whole        a request whose rest would be at most `tail_frac` of it goes whole when
                        the token cap allows: the rest would pay a chunk's fixed costs in a later
                        wave and split that wave out of step. Off: paper within-2% 40 -> 37, 10
                        settings lose, worst -3.2% (MiniMax-M2 cold c = 128).
      never_stall       nothing fits T: one block of the first request goes. Off: kimi 7
                        settings at c <= 4 never finish (the runtime hangs the same way).

    Removed after the ablation (no setting lost over 0.5%, no count moved): filling a wave to
    its token cap once the share exceeds a full wave after the longest prefix (T = inf; one
    paper setting, -0.08%), and skipping a cut shorter than a block (dead: chunk ends after a
    block-aligned start align down, so such a cut never forms a chunk).

    State: the waves planned and not yet back (see `Planner`), and the longest predicted wave
    of the busy period; waves in flight are the ones whose chunks have not all completed (the
    leader advances `num_computed_tokens` and finishes requests as waves come back).
    """

    name = "balanced"

    def __init__(
        self,
        config: PlannerConfig,
        cost_model: CostModel | None = None,
        target_waves: int | None = None,
        overhead_frac: float = 0.03,
        tail_frac: float = 0.125,
        rules: BalancedRules = ALL_RULES,
    ):
        self.config = config
        self.rules = rules
        self.tail_frac = tail_frac
        self.cost = cost_model or CostModel()
        self.target_waves = target_waves or config.num_stages
        self.overhead_frac = overhead_frac
        # planned waves not yet back: (predicted chunk seconds, ((request, chunk end), ...))
        self._in_flight: list[tuple[float, tuple[tuple[Request, int], ...]]] = []
        # the longest predicted wave sent since the pipeline last drained
        self._longest_s = 0.0

    @property
    def num_in_flight(self) -> int:
        self._retire()
        return len(self._in_flight)

    def wave_tokens(self, requests: Sequence[Request]) -> int:
        """The most tokens a wave may hold: M, or 2M when filling waves and the work waiting
        would fill `deep_queue_waves` waves of 2M per stage (a queue that deep amortizes the
        longer fill and drain of larger waves, and the per-wave costs halve). `plan` caps a 2M
        wave's time at the longest wave of the busy period."""
        cfg = self.config
        if not cfg.fill_waves or cfg.deep_queue_waves <= 0 or not self.rules.double_deep_queue:
            return cfg.max_wave_tokens
        waiting = sum(r.num_unscheduled_tokens for r in requests)
        deep = waiting >= cfg.deep_queue_waves * cfg.num_stages * 2 * cfg.max_wave_tokens
        return 2 * cfg.max_wave_tokens if deep else cfg.max_wave_tokens

    def in_flight_work(self) -> float:
        """Predicted chunk time of the waves in flight (their per-wave costs left out)."""
        self._retire()
        return sum(t for t, _ in self._in_flight)

    def target_time(
        self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING
    ) -> float:
        """The next wave's predicted time T (the rules of the class docstring)."""
        cost, cfg, rules = self.cost, self.config, self.rules
        work = sum(
            cost.chunk_time(r.num_scheduled_tokens, r.num_unscheduled_tokens) for r in requests
        )
        # requests in admission are work of the next round: without them, the first request
        # admitted would spread over S thin waves while the rest of its burst is being admitted
        if rules.count_admitting:
            work += sum(cost.chunk_time(cached, new) for cached, new in admitting.items)
        flight = self.in_flight_work() if rules.count_in_flight else 0.0
        spread = cost.coef.c_wave + (work + flight) / self.target_waves
        mean_prefix = sum(r.num_scheduled_tokens for r in requests) / max(1, len(requests))
        lo = cost.wave_time([(0, cfg.min_wave_tokens)]) if rules.min_wave_floor else 0.0
        if cfg.fill_waves:  # the token cap binds once the share exceeds a full wave
            return max(spread, lo)
        # the M tokens at hand, packed first come first served (the wave a fixed M-token budget
        # sends): after long prefixes a token costs more (attention), and each chunk pays its
        # fixed costs, so a cap of one M-token chunk cut waves of many short chunks below M
        hi = (
            cost.wave_time(first_tokens(requests, cfg.max_wave_tokens))
            if rules.first_tokens_cap
            else math.inf
        )
        # fixed costs of a wave: its own, and per chunk the overhead plus reading the cached
        # prefix (g*L: large after long prefixes, e.g. MLA re-expansion), paid again per chunk
        fixed = cost.coef.c_wave + cost.coef.c0 + cost.coef.g * mean_prefix
        efficient = fixed / self.overhead_frac if rules.overhead_cap else math.inf
        return max(min(spread, hi, efficient), lo)

    def holds(self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING) -> bool:
        """True when what waits is under `hold_frac` of a share and more comes soon enough:
        the pipeline is full (a wave comes back), or waves are in flight and the running
        admission round ends before sending its requests in a wave of their own would cost
        more than one wave with them (the cost model's per-wave and small-wave costs). In a
        closed loop at low concurrency a thin wave sent beside every round splits every wave."""
        if self.config.hold_frac <= 0:
            return False
        in_flight = self.num_in_flight
        if in_flight == 0:
            return False
        cost = self.cost
        rests = [(r.num_scheduled_tokens, r.num_unscheduled_tokens) for r in requests]
        pending = 0.0
        if in_flight >= self.target_waves and not self.rules.hold_when_full:
            return False
        if in_flight < self.target_waves:
            if not self.rules.hold_for_round:
                return False
            coming = list(admitting.round_items)
            if not coming:
                return False
            saving = cost.wave_time(rests) + cost.wave_time(coming) - cost.wave_time(rests + coming)
            if admitting.round_left_s >= saving:
                return False
            pending = sum(cost.chunk_time(cached, new) for cached, new in coming)
        work = sum(cost.chunk_time(L, x) for L, x in rests)
        return (
            work
            < self.config.hold_frac * (work + pending + self.in_flight_work()) / self.target_waves
        )

    def plan(
        self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING
    ) -> list[Chunk]:
        cfg, cost, rules = self.config, self.cost, self.rules
        if self.num_in_flight == 0:
            self._longest_s = 0.0  # the pipeline drained: a new busy period
        if (
            rules.cold_first
            and cfg.fill_waves
            and self.num_in_flight < self.target_waves
            and all(r.num_cached_tokens == 0 for r in requests)
        ):
            # the pipeline is filling with cold prompts only: the ones with nothing sent yet go
            # first (a filled wave of chunks from an empty prefix is the cheapest one, so the
            # stages downstream start sooner); the rest keep their order behind them
            requests = sorted(requests, key=lambda r: r.num_scheduled_tokens > 0)
        if self.holds(requests, admitting):  # a wave or the round brings more
            return []
        left = self.target_time(requests, admitting) - cost.coef.c_wave
        token_cap = self.wave_tokens(requests)
        if token_cap > cfg.max_wave_tokens and rules.cap_double_at_longest:
            # a 2M wave may not outlast the longest wave of this busy period (or an M-token
            # wave now): S stages run in the sum of the wave times plus (S - 1) times the
            # longest, so a wave longer than all the others costs S - 1 times its excess
            m_wave = cost.wave_time(first_tokens(requests, cfg.max_wave_tokens))
            left = min(left, max(self._longest_s, m_wave) - cost.coef.c_wave)
        chunks: list[Chunk] = []
        for req in requests:
            if left <= 0 or token_cap <= 0 or len(chunks) >= cfg.max_chunks_per_wave:
                break
            L, need = req.num_scheduled_tokens, req.num_unscheduled_tokens
            x = min(need, token_cap)
            if cost.chunk_time(L, x) > left * (1 + 1e-9):
                x = cost.max_chunk_tokens(L, left)
                if rules.tail_whole and need <= token_cap and need - x <= self.tail_frac * need:
                    x = need  # a short rest would pay a chunk's fixed costs in a later wave
            chunk = chunk_of(req, x, cfg.block_size)
            if chunk is None:
                continue
            chunks.append(chunk)
            left -= cost.chunk_time(L, chunk.num_tokens)
            token_cap -= chunk.num_tokens
        if (
            rules.never_stall and not chunks and requests
        ):  # never stall: at least one block of the first request
            chunk = chunk_of(requests[0], cfg.block_size, cfg.block_size)
            chunks = [chunk] if chunk else []
        chunks = align_chunk_ends(chunks, requests, cfg, max(0, token_cap))
        if chunks:
            self._longest_s = max(
                self._longest_s, cost.wave_time([(c.start, c.num_tokens) for c in chunks])
            )
            by_id = {r.request_id: r for r in requests}
            self._in_flight.append(
                (
                    sum(cost.chunk_time(c.start, c.num_tokens) for c in chunks),
                    tuple((by_id[c.request_id], c.end) for c in chunks),
                )
            )
        return chunks

    def observe(self, chunks, seconds: float) -> None:
        self.cost.observe(chunks, seconds)

    def _retire(self) -> None:
        """Forget waves whose chunks have all come back (or whose requests ended)."""
        self._in_flight = [
            w
            for w in self._in_flight
            if any(not r.state.finished and r.num_computed_tokens < end for r, end in w[1])
        ]
