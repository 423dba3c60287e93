"""Wave planners: which chunks of which admitted requests form the next wave, and how long each
chunk is.

Every planner packs first-come-first-served over the plannable requests (admitted, tokens left,
dependencies dispatched), at most one chunk per request per wave. Chunk ends after the reused
prefix are aligned to the block size, except a request's final chunk:

    [0, start)  reused or already dispatched | [start, end) this chunk | [end, num_tokens) later
                                               end % block_size == 0 or end == num_tokens

Planners differ in the size of a wave:
  static    a fixed token budget (vLLM's max_num_batched_tokens style)
  mpu       the paper's budget halving with hysteresis, from the available work
  balanced  a fitted cost model: each wave takes an equal share of all the work in the system,
            waiting and in flight, over `target_waves` waves; it holds back thin waves while
            the pipeline is full
  dynamic   SGLang's dynamic chunking (dynamic_chunk.py): the chunked request's next chunk
            costs what the initial chunk did, by a fitted quadratic

Hybrid models: every planner's wave then goes through `align_chunk_ends` (snapshot_align.py),
which moves chunk ends onto nearby snapshot boundaries (PlannerConfig.snapshot_align_frac).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from wavepp.sched.cost_model import CostModel
from wavepp.sched.dynamic_chunk import DynamicChunkPlanner
from wavepp.sched.messages import Chunk
from wavepp.sched.request import Request
from wavepp.sched.snapshot_align import align_chunk_ends


@dataclass(frozen=True)
class PlannerConfig:
    block_size: int = 16
    num_stages: int = 2
    # M: the largest wave (mpu, balanced). On the 2-core CPU runtime, waves past ~512 tokens
    # bought no efficiency and cost pipeline fill and drain (measured with `wavepp bench`).
    max_wave_tokens: int = 512
    min_wave_tokens: int = 64       # b_min: the smallest (mpu, balanced)
    static_wave_tokens: int = 512   # the static planner's budget
    max_chunks_per_wave: int = 256
    # the mpu planner's M and b_min; None: max_wave_tokens and min_wave_tokens. The paper runs
    # microbatch 16,384 and b_min 8,192 (MPU_PAPER_TOKENS); scaled to this CPU's 512-token
    # waves that is 512 and 256
    mpu_microbatch_tokens: int | None = None
    mpu_min_tokens: int | None = None
    # balanced: fill waves to M tokens after the longest prefix (True; GPU deployments, M from
    # the profiling pass) or keep predicted wave times equal under the fixed-cost cap (False)
    fill_waves: bool = False
    # balanced: share out the work in flight with the work waiting (False: the waiting work
    # alone, the planner before in-flight accounting)
    count_in_flight: bool = True
    # balanced: with the pipeline full, hold back waves under this fraction of a fair share
    hold_frac: float = 0.5
    # balanced, filling waves: waves grow to 2M once this many waves of 2M per stage wait (and
    # no longer than the longest wave so far, `BalancedPlanner.plan`); 0: never. Chosen on the
    # simulator's grids (settings where wavepp is best, paper of 40 / kimi of 18 at c >= 8):
    # 0: 36/11, 2: 40/18, 3: 40/18, 4: 40/18, 5: 39/18, 6: 39/17, 8: 38/16
    deep_queue_waves: int = 4
    # hybrid models (sched/snapshot_align.py): a chunk end moves onto a snapshot boundary (a
    # multiple of snapshot_interval_blocks blocks, or the request's last reusable boundary) at
    # most this fraction of the chunk away: down, or up where the wave's budget has room.
    # 1/8 keeps every wave within 1/8 of its planned tokens; 0: never move. The interval is the
    # stages' snapshot grid; 0 (models without linear-attention layers): no alignment
    snapshot_interval_blocks: int = 0
    snapshot_align_frac: float = 0.125

    def __post_init__(self) -> None:
        for name in ("block_size", "num_stages", "max_wave_tokens", "min_wave_tokens",
                     "static_wave_tokens", "max_chunks_per_wave"):
            if getattr(self, name) <= 0:
                raise ValueError(f"PlannerConfig.{name} must be positive, got {getattr(self, name)}")
        if self.min_wave_tokens > self.max_wave_tokens:
            raise ValueError(f"PlannerConfig.min_wave_tokens={self.min_wave_tokens} exceeds "
                             f"max_wave_tokens={self.max_wave_tokens}")
        if self.deep_queue_waves < 0:
            raise ValueError(f"PlannerConfig.deep_queue_waves must be >= 0, got {self.deep_queue_waves}")
        if self.snapshot_interval_blocks < 0:
            raise ValueError(f"PlannerConfig.snapshot_interval_blocks must be >= 0, got {self.snapshot_interval_blocks}")
        if not 0 <= self.snapshot_align_frac < 1:
            raise ValueError(f"PlannerConfig.snapshot_align_frac must be in [0, 1), got {self.snapshot_align_frac}")
        if not 0 <= self.hold_frac < 1:
            raise ValueError(f"PlannerConfig.hold_frac must be in [0, 1), got {self.hold_frac}")
        for name in ("mpu_microbatch_tokens", "mpu_min_tokens"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"PlannerConfig.{name} must be positive, got {getattr(self, name)}")
        if self.mpu_budgets[1] > self.mpu_budgets[0]:
            raise ValueError(f"PlannerConfig: the mpu b_min {self.mpu_budgets[1]} exceeds its "
                             f"microbatch {self.mpu_budgets[0]}")

    @property
    def mpu_budgets(self) -> tuple[int, int]:
        """(M, b_min) of the mpu planner."""
        return (self.mpu_microbatch_tokens or self.max_wave_tokens,
                self.mpu_min_tokens or self.min_wave_tokens)


@dataclass(frozen=True)
class Admitting:
    """Work on its way to the planner: the requests in the admission round now running, then
    those waiting for one, as (cached, new) tokens each (cached is 0 until a round agrees the
    prefix: an upper bound on the work)."""
    items: Sequence[tuple[int, int]] = ()
    in_round: int = 0                    # the first `in_round` items are in the running round
    round_left_s: float = math.inf       # predicted seconds until that round ends

    def __post_init__(self) -> None:
        if not 0 <= self.in_round <= len(self.items):
            raise ValueError(f"Admitting.in_round={self.in_round} outside 0..{len(self.items)}")
        if self.round_left_s < 0:
            raise ValueError(f"Admitting.round_left_s must be >= 0, got {self.round_left_s}")

    @property
    def round_items(self) -> Sequence[tuple[int, int]]:
        return self.items[:self.in_round]


NOTHING_ADMITTING = Admitting()


# The paper's MPU settings: microbatch M = 16,384 tokens, b_min = 8,192.
MPU_PAPER_TOKENS = (16384, 8192)


class Planner(Protocol):
    name: str

    def plan(self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING) -> list[Chunk]:
        """Chunks of the next wave from `requests` (plannable, FCFS order). Mutates nothing.

        `admitting`: the requests in or waiting for an admission round, work that becomes
        plannable within a round's time. Only `balanced` weighs it."""

    def observe(self, chunks: Sequence[tuple[int, int]], seconds: float) -> None:
        """A wave of (num_cached, num_new) chunks took `seconds` on its slowest stage."""


def align_down(value: int, block_size: int) -> int:
    return value // block_size * block_size


def chunk_of(req: Request, num_new: int, block_size: int) -> Chunk | None:
    """The next chunk of `req` with at most `num_new` tokens, its end aligned unless final."""
    start = req.num_scheduled_tokens
    end = start + num_new
    if end >= req.num_tokens:
        end = req.num_tokens
    else:
        end = align_down(end, block_size)
    if end <= start:
        return None
    logprob_start, logprob_token_ids = req.logprob_token_ids(start, end)
    return Chunk(req.request_id, start, end, end == req.num_tokens, logprob_start, logprob_token_ids)


def first_tokens(requests: Sequence[Request], num_tokens: int) -> list[tuple[int, int]]:
    """(num_cached, num_new) of the first `num_tokens` unscheduled tokens, FCFS, a chunk per
    request (block alignment left out: a cost estimate)."""
    shapes, left = [], num_tokens
    for req in requests:
        if left <= 0:
            break
        x = min(left, req.num_unscheduled_tokens)
        if x > 0:
            shapes.append((req.num_scheduled_tokens, x))
            left -= x
    return shapes


def pack_tokens(requests: Sequence[Request], budget: int, config: PlannerConfig,
                min_fragment: int) -> list[Chunk]:
    """FCFS packing of up to `budget` tokens. A request that does not fit whole is split only
    if the remaining budget is at least `min_fragment` (no tiny tail fragments)."""
    chunks: list[Chunk] = []
    left = budget
    for req in requests:
        if left <= 0 or len(chunks) >= config.max_chunks_per_wave:
            break
        need = req.num_unscheduled_tokens
        if need > left and left < min_fragment:
            continue
        chunk = chunk_of(req, min(need, left), config.block_size)
        if chunk is not None:
            chunks.append(chunk)
            left -= chunk.num_tokens
    return align_chunk_ends(chunks, requests, config, max(0, left))


class StaticPlanner:
    name = "static"

    def __init__(self, config: PlannerConfig):
        self.config = config

    def plan(self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING) -> list[Chunk]:
        return pack_tokens(requests, self.config.static_wave_tokens, self.config,
                           self.config.block_size)

    def observe(self, chunks, seconds: float) -> None:
        pass


class MpuPlanner:
    """The paper's MPU planner.

    Execution ring R = 2P, target S = R + (F-1)P waves (F = 2). Candidate budgets halve from M
    down to b_min (block aligned; `PlannerConfig.mpu_budgets`, the paper's 16,384 and 8,192). With W admitted-but-unscheduled tokens and N_{>b/2} requests
    holding more than b/2 of them, budget b supports n(b) = max(W/b, N_{>b/2}) waves; the planner
    proposes the largest b with n(b) >= S (else b_min). Hysteresis: it raises its budget after
    R/2 consecutive proposals above it, lowers it after P below it.
    """
    name = "mpu"

    def __init__(self, config: PlannerConfig, fill_factor: int = 2):
        self.config = config
        p = config.num_stages
        self.ring = 2 * p
        self.target_waves = self.ring + (fill_factor - 1) * p
        self.budgets = budget_ladder(*config.mpu_budgets, config.block_size)
        self.budget = self.budgets[0]
        self._streak_up = 0
        self._streak_down = 0

    def propose(self, requests: Sequence[Request]) -> int:
        work = sum(r.num_unscheduled_tokens for r in requests)
        for b in self.budgets:   # largest first
            n_long = sum(1 for r in requests if r.num_unscheduled_tokens > b / 2)
            if max(work / b, n_long) >= self.target_waves:
                return b
        return self.budgets[-1]

    def decide(self, proposal: int) -> int:
        """Apply hysteresis to a proposal; returns the budget in force."""
        if proposal > self.budget:
            self._streak_up, self._streak_down = self._streak_up + 1, 0
            if self._streak_up >= max(1, self.ring // 2):
                self.budget, self._streak_up = proposal, 0
        elif proposal < self.budget:
            self._streak_down, self._streak_up = self._streak_down + 1, 0
            if self._streak_down >= self.config.num_stages:
                self.budget, self._streak_down = proposal, 0
        else:
            self._streak_up = self._streak_down = 0
        return self.budget

    def plan(self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING) -> list[Chunk]:
        b = self.decide(self.propose(requests))
        return pack_tokens(requests, b, self.config, max(self.budgets[-1], b // 2))

    def observe(self, chunks, seconds: float) -> None:
        pass


class BalancedPlanner:
    """Waves sized by a fitted cost model from all the work in the system, in flight included.

    The pipeline wants `target_waves` waves in flight (default: one per stage), each carrying
    an equal share of all the work in the system: the work waiting (W, predicted chunk time of
    every plannable request's rest, and of every request waiting for or in an admission round,
    at its agreed prefix or, before the round agrees one, at none) and the work in flight (F,
    the chunks of the waves this planner sent that have not come back). The wave time target is

        T = c_wave + (W + F) / target_waves

    With the pipeline empty the work at hand spreads over S waves; with waves in flight the
    next one takes its share of the whole, not a share of what is left, so a few requests
    arriving beside full waves do not split into ever thinner waves (each paying the per-wave
    cost, and on a GPU reading every weight for few rows), and a burst of arrivals does not go
    out as one lump that comes back as one lump. With `target_waves` in flight already and
    less than `hold_frac` of a share waiting, the planner sends nothing: the next wave to come
    back brings more work, and one fuller wave costs less than two thin ones. The same holds
    with fewer waves in flight while an admission round runs (its requests count in the share):
    the round's end plans again within a round's time, while a thin wave sent now leaves the
    round's requests a wave of their own (in a closed loop at low concurrency, every wave).

    T is clamped between the cost of a b_min-token wave and a cap; a wave never holds more
    than M tokens. Two caps (`PlannerConfig.fill_waves`):
      equal times (default)  an M-token wave after the mean prefix at hand, or less, the time
                             beyond which the fixed costs of a wave (its own overhead, and per
                             chunk the overhead plus re-reading the cached prefix) fall under
                             `overhead_frac` of it: chunks after long prefixes get fewer tokens,
                             and every wave costs about the same (the CPU runtime, M = 512)
      fill waves             an M-token wave after the longest prefix at hand: waves fill to M
                             tokens (at the cap the token count binds, not the time, however
                             many chunks share the wave), M the efficient size from the
                             profiling pass (`efficient_wave_tokens`), 2M behind a deep queue
                             (`wave_tokens`) if no longer than the longest wave so far. On a
                             GPU a chunk cut short after a long prefix pays its per-chunk
                             costs (MLA re-expansion of the prefix) and the per-wave weight
                             reads again for fewer tokens.
    Through S stages every wave pays its time once per stage, and the longest wave S - 1 more
    times: waves each taking t_i on every stage, in any order, finish after sum(t_i) + (S - 1)
    max(t_i) (a proportionate flow shop). So a wave that outlasts every other one of its busy
    period costs S - 1 times its excess in fill and drain: one 16k-token wave among 8k ones
    through 8 stages ends a run later by 7 times the difference. A 2M wave therefore takes no
    longer than the longest wave sent since the pipeline last drained, or than an M-token wave
    of the requests at hand; after long prefixes that cap binds, after short ones 2M fit.
    While the pipeline fills (filling waves, fewer than `target_waves` in flight) with cold
    prompts only (nothing cached in any ready request), those with nothing sent yet go first: a
    filled wave of chunks from an empty prefix is the cheapest one, so the stages downstream
    start sooner (the eight cold prompts of GLM-5 short-suffix then go one first chunk each, as
    TensorRT-LLM's loop sends them, not each one's chunks back to back with rising prefixes).
    With a warm request ready the order stays FCFS: moving cold prompts ahead of warm ones
    delays the results that feed a closed loop (GLM-5 mixed at c = 8: 6% slower).
    Packing is FCFS: a request that fits in what is left of T goes whole, else it gets the
    largest aligned chunk that does; a chunk shorter than a block never forms. A request whose
    rest would be at most `tail_frac` of it goes whole when the token cap allows: the rest
    would pay a chunk's fixed costs again in a later wave, and split that wave out of step.

    Waves in flight are the ones this planner planned whose chunks have not all completed
    (the leader advances `num_computed_tokens` and finishes requests as waves come back).
    """
    name = "balanced"

    def __init__(self, config: PlannerConfig, cost_model: CostModel | None = None,
                 target_waves: int | None = None, overhead_frac: float = 0.03,
                 tail_frac: float = 0.125):
        self.config = config
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
        if not cfg.fill_waves or cfg.deep_queue_waves <= 0:
            return cfg.max_wave_tokens
        waiting = sum(r.num_unscheduled_tokens for r in requests)
        deep = waiting >= cfg.deep_queue_waves * cfg.num_stages * 2 * cfg.max_wave_tokens
        return 2 * cfg.max_wave_tokens if deep else cfg.max_wave_tokens

    def in_flight_work(self) -> float:
        """Predicted chunk time of the waves in flight (their per-wave costs left out)."""
        self._retire()
        return sum(t for t, _ in self._in_flight)

    def target_time(self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING) -> float:
        """The next wave's predicted time (inf: as many tokens as the token cap allows)."""
        cost, cfg = self.cost, self.config
        work = sum(cost.chunk_time(r.num_scheduled_tokens, r.num_unscheduled_tokens) for r in requests)
        # requests in admission are work of the next round: without them, the first request
        # admitted would spread over S thin waves while the rest of its burst is being admitted
        work += sum(cost.chunk_time(cached, new) for cached, new in admitting.items)
        flight = self.in_flight_work() if cfg.count_in_flight else 0.0
        spread = cost.coef.c_wave + (work + flight) / self.target_waves
        mean_prefix = sum(r.num_scheduled_tokens for r in requests) / max(1, len(requests))
        lo = cost.wave_time([(0, cfg.min_wave_tokens)])
        if cfg.fill_waves:
            longest = max((r.num_scheduled_tokens for r in requests), default=0)
            if spread >= cost.wave_time([(longest, self.wave_tokens(requests))]):
                # The wave fills to its token cap. A time cap would cut it short whenever it
                # holds more than one chunk (each pays its per-chunk costs), and every later
                # wave would then split a request out of step with its end.
                return math.inf
            return max(spread, lo)
        # the M tokens at hand, packed first come first served (the wave a fixed M-token budget
        # sends): after long prefixes a token costs more (attention), and each chunk pays its
        # fixed costs, so a cap of one M-token chunk cut waves of many short chunks below M
        hi = cost.wave_time(first_tokens(requests, cfg.max_wave_tokens))
        # fixed costs of a wave: its own, and per chunk the overhead plus reading the cached
        # prefix (g*L: large after long prefixes, e.g. MLA re-expansion), paid again per chunk
        fixed = cost.coef.c_wave + cost.coef.c0 + cost.coef.g * mean_prefix
        efficient = fixed / self.overhead_frac
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
        if in_flight < self.target_waves:
            coming = list(admitting.round_items)
            if not coming:
                return False
            saving = cost.wave_time(rests) + cost.wave_time(coming) - cost.wave_time(rests + coming)
            if admitting.round_left_s >= saving:
                return False
            pending = sum(cost.chunk_time(cached, new) for cached, new in coming)
        work = sum(cost.chunk_time(L, x) for L, x in rests)
        return work < self.config.hold_frac * (work + pending + self.in_flight_work()) / self.target_waves

    def plan(self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING) -> list[Chunk]:
        cfg, cost = self.config, self.cost
        if self.num_in_flight == 0:
            self._longest_s = 0.0    # the pipeline drained: a new busy period
        if cfg.fill_waves and self.num_in_flight < self.target_waves and \
                all(r.num_cached_tokens == 0 for r in requests):
            # the pipeline is filling with cold prompts only: the ones with nothing sent yet go
            # first (a filled wave of chunks from an empty prefix is the cheapest one, so the
            # stages downstream start sooner); the rest keep their order behind them
            requests = sorted(requests, key=lambda r: r.num_scheduled_tokens > 0)
        if self.holds(requests, admitting):   # a wave or the round brings more
            return []
        left = self.target_time(requests, admitting) - cost.coef.c_wave
        token_cap = self.wave_tokens(requests)
        if token_cap > cfg.max_wave_tokens:
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
                if need <= token_cap and need - x <= self.tail_frac * need:
                    x = need    # a short rest would pay a chunk's fixed costs in a later wave
                if x < need and x < cfg.block_size:
                    continue
            chunk = chunk_of(req, x, cfg.block_size)
            if chunk is None:
                continue
            chunks.append(chunk)
            left -= cost.chunk_time(L, chunk.num_tokens)
            token_cap -= chunk.num_tokens
        if not chunks and requests:   # never stall: at least one block of the first request
            chunk = chunk_of(requests[0], cfg.block_size, cfg.block_size)
            chunks = [chunk] if chunk else []
        chunks = align_chunk_ends(chunks, requests, cfg, max(0, token_cap))
        if chunks:
            self._longest_s = max(self._longest_s, cost.wave_time([(c.start, c.num_tokens) for c in chunks]))
            by_id = {r.request_id: r for r in requests}
            self._in_flight.append((sum(cost.chunk_time(c.start, c.num_tokens) for c in chunks),
                                    tuple((by_id[c.request_id], c.end) for c in chunks)))
        return chunks

    def observe(self, chunks, seconds: float) -> None:
        self.cost.observe(chunks, seconds)

    def _retire(self) -> None:
        """Forget waves whose chunks have all come back (or whose requests ended)."""
        self._in_flight = [w for w in self._in_flight
                           if any(not r.state.finished and r.num_computed_tokens < end for r, end in w[1])]


def budget_ladder(max_tokens: int, min_tokens: int, block_size: int) -> list[int]:
    """M, M/2, M/4, ... down to b_min, each aligned to the block size (at least one block)."""
    floor = max(block_size, align_down(min_tokens, block_size))
    ladder, b = [], max(floor, align_down(max_tokens, block_size))
    while b > floor:
        ladder.append(b)
        b = max(floor, align_down(b // 2, block_size))
    ladder.append(floor)
    return ladder


PLANNERS: dict[str, Callable[..., Planner]] = {
    "static": StaticPlanner,
    "mpu": MpuPlanner,
    "balanced": BalancedPlanner,
    "dynamic": DynamicChunkPlanner,
}


def make_planner(name: str, config: PlannerConfig, **kwargs) -> Planner:
    try:
        factory = PLANNERS[name]
    except KeyError:
        raise ValueError(f"unknown planner {name!r}; choose one of {sorted(PLANNERS)}") from None
    return factory(config, **kwargs)
