"""TensorRT-LLM's pipeline-parallel executor as its code runs it, one switchable mechanism at a time.

`trtllm-pp` (sim/loops/loop_sim.py) runs `PyExecutor._executor_loop_pp` step by step;
`TrtllmMechanisms` says which of the scheduler's and the KV cache manager's behaviours ride on that
loop. Paths are in NVIDIA/TensorRT-LLM.

    switch            TensorRT-LLM                                            where
    max_num_tokens    the microbatch's token budget (16,384 in the paper's     llmapi/llm_args.py (default 8,192)
                      setup)
    budget_charge     "prompt": the micro-batch scheduler sizes a new context cpp/tensorrt_llm/batch_manager/
                      request's chunk from its whole remaining prompt (its    microBatchScheduler.cpp, FCFS chunk
                      position is 0: reuse is not known yet) and charges it   sizing: chunk = min(capacity,
                      against the budget; prepare_resources -> add_sequence   getContextRemainingLength()), floored
                      finds the reuse afterwards and moves the chunk past the to the chunk unit; capacity -= chunk.
                      cached prefix without shrinking it (a 28K + 4K prompt   llmRequest.h setPrepopulatedPromptLen
                      under 16,384 fills a microbatch alone with 4K tokens).  (the window shifts, the end floors to
                      "uncached": the budget is charged the tokens computed   a block). PRs #11637 (Feb 2026),
                      (the reuse estimate of 2026: a probe per waiting        #12976 (Apr 2026), #15066 (Jun 2026)
                      request). "static": this simulator's earlier packing    bring "uncached"; #15065 describes
                      (computed tokens, the static planner)                   "prompt" still under MAX_UTILIZATION
    probe             the radix-tree walk that finds the reuse, which goes    cpp/tensorrt_llm/batch_manager/
                      block by block down the prompt until a miss:            kvCacheManager.cpp (loadOrAllocate-
                      "measured": the paper's median, 64.4 ms, for a walk     Blocks: per block a BlockKey of its
                      down the 4K-suffix workload's 28K-token prefix, in      tokens, hashed, looked up among the
                      proportion to the tokens a walk matches (at least one   node's children)
                      block); "constant": 64.4 ms per walk, whatever it
                      matches; "blocks": probe_block_s per block walked
                      (each matched block and the first miss); "none": the
                      earlier per-block match cost (LoopCosts). The 2026
                      budget estimate (countReusableBlocks) walks the same
                      tree under its mutex: "uncached" implies such walks
    probe_scope       "scheduled": once per request, when the scheduler first _torch/pyexecutor/resource_manager.py
                      puts it in a microbatch (add_sequence), on every rank   (KVCacheManager.prepare_resources ->
                      (each walks its own tree); "waiting": every waiting     add_sequence); PR #19366 (Sep 2026):
                      request every iteration on rank 0's scheduler (the KV   the v2 scheduler probes pending
                      cache v2 scheduler's prefix-aware probe)                requests even when they cannot fit
    probe_on_executor True: the walk runs on the rank's executor thread       _torch/pyexecutor/py_executor.py
                      before it launches the microbatch, delaying it by the   (_executor_loop_pp: _schedule,
                      walk's time; False: off the executor path (uncharged)   _prepare_resources, then forward)
    min_rank_pools    every rank's pool holds the tokens the smallest rank    _torch/pyexecutor/resource_manager.py
                      fits (max_tokens allreduced with MIN across ranks)      ("make sure all ranks use same value
                                                                              for maxTokens": allreduce MIN)
    reuse_on_retire   a prefix becomes reusable when the request that         storeContextBlocks after the context
                      computes it retires (its microbatch finalized, P-1     phase (KVCacheManager); a request
                      iterations on); a request scheduled before that         scheduled before computes the prefix
                      computes the prefix again                               again
    admit_on_schedule a request's KV is allocated and its reuse found when    prepare_resources on the scheduled
                      the scheduler first puts it in a microbatch, not        requests only
                      ahead of it
    overlap_chunks    a context request's next chunk may go in the next       PR #9308 (Nov 2025, "Overlap context
                      microbatch while the one before is in flight; False:    chunks in pipeline parallel mode":
                      a request is in one microbatch at a time (in-flight     chunking requests are kept out of
                      request ids, the loop before that change)              the in-flight set)
    forward_sync      True: a non-last rank waits for its own forward before  _torch/pyexecutor/py_executor.py
                      it goes on (period = forward + host work); False: it    _forward_step_inter_pp: versions with
                      waits only for the microbatch before (host work and     sampler_event.synchronize() in it, and
                      forward overlap: period = max of the two)               the version after #9308, which records
                                                                              the event and syncs the previous
                                                                              microbatch's ("sync_previous_sampler_event")
    max_batch_size    requests per microbatch                                 (128 in the paper's setup)

`TRTLLM_LEGACY` is this simulator's earlier `trtllm-pp` (every switch off, 8,192 tokens);
`TRTLLM_RC26` the paper's baseline, TensorRT-LLM 1.3.0rc26. Not modelled: the loop's
response flow on a background thread (PR #10349, Jan 2026): here a rank still receives and
relays the sample state on its executor loop, as before that change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from wavepp.sched.messages import Chunk
from wavepp.sched.planners.base import NOTHING_ADMITTING, Admitting, PlannerConfig, chunk_of
from wavepp.sched.planners.snapshot_align import align_chunk_ends
from wavepp.sched.request import Request, RequestState

CHARGES = ("static", "prompt", "uncached")
PROBES = ("none", "measured", "constant", "blocks")
PROBE_SCOPES = ("scheduled", "waiting")

# The paper's measurement of TensorRT-LLM's reuse probe (its radix-tree walk): a median of
# 64.4 ms, against 24 us for the hint index (arXiv 2609.35263).
PAPER_PROBE_S = 64.4e-3
# The prefix that walk is taken to cover: the 4K-suffix workload's shared prefix
# (sim/studies/grid.py)
PAPER_PROBE_TOKENS = 28672


@dataclass(frozen=True)
class TrtllmMechanisms:
    """Which of TensorRT-LLM's behaviours `trtllm-pp` runs (the table above); validated here."""

    max_num_tokens: int = 8192
    budget_charge: str = "static"
    probe: str = "none"
    probe_s: float = PAPER_PROBE_S  # "measured", "constant": seconds per walk
    probe_ref_tokens: int = PAPER_PROBE_TOKENS  # "measured": the tokens such a walk matches
    probe_block_s: float = 0.5e-6  # "blocks": seconds per block walked (LoopCosts.match_block_s)
    probe_scope: str = "scheduled"
    probe_on_executor: bool = True
    min_rank_pools: bool = False
    reuse_on_retire: bool = False
    admit_on_schedule: bool = False
    overlap_chunks: bool = False
    forward_sync: bool = True
    max_batch_size: int = 256

    def __post_init__(self) -> None:
        for name, valid in (
            ("budget_charge", CHARGES),
            ("probe", PROBES),
            ("probe_scope", PROBE_SCOPES),
        ):
            if getattr(self, name) not in valid:
                raise ValueError(
                    f"TrtllmMechanisms.{name} must be one of {valid}, got {getattr(self, name)!r}"
                )
        for name in ("max_num_tokens", "max_batch_size", "probe_ref_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"TrtllmMechanisms.{name} must be positive, got {getattr(self, name)}"
                )
        for name in ("probe_s", "probe_block_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrtllmMechanisms.{name} must be >= 0, got {getattr(self, name)}")

    def with_changes(self, **changes) -> "TrtllmMechanisms":
        return replace(self, **changes)


TRTLLM_LEGACY = TrtllmMechanisms()
TRTLLM_RC26 = TrtllmMechanisms(
    max_num_tokens=16384,
    budget_charge="prompt",
    probe="measured",
    min_rank_pools=True,
    reuse_on_retire=True,
    admit_on_schedule=True,
    overlap_chunks=True,
    forward_sync=False,
    max_batch_size=128,
)
TRTLLM_PRESETS = {"legacy": TRTLLM_LEGACY, "rc26": TRTLLM_RC26}


def get_trtllm(name: str) -> TrtllmMechanisms:
    if name not in TRTLLM_PRESETS:
        raise ValueError(
            f"unknown trtllm preset {name!r}; choose one of {', '.join(TRTLLM_PRESETS)}"
        )
    return TRTLLM_PRESETS[name]


# ---- the micro-batch scheduler's budget ------------------------------------------------------


def blocks_walked(num_cached: int, num_tokens: int, block: int) -> int:
    """Blocks a radix walk down a prompt of `num_tokens` visits when `num_cached` of them match:
    each matched block and the one where it misses (none past the prompt's last)."""
    return min(num_cached // block + 1, -(-num_tokens // block))


def budget_chunk(remaining: int, capacity: int, unit: int) -> int:
    """FCFS chunk sizing: the remaining context, cut to the capacity left and then floored to
    the chunk unit (only when cut)."""
    chunk = min(remaining, capacity)
    return chunk if chunk == remaining else chunk // unit * unit


def shifted_end(num_cached: int, chunk: int, num_tokens: int, unit: int) -> int:
    """Where a chunk scheduled from position 0 ends once reuse moves it past `num_cached` tokens:

    [0, num_cached) reused | [num_cached, end) computed, end = (num_cached + chunk) floored to
    the unit, or the prompt's end if that is past it
    """
    end = num_cached + chunk
    return num_tokens if end >= num_tokens else end // unit * unit


def charge_of(
    req: Request, capacity: int, unit: int, charge: str, *, est_cached: int = 0
) -> tuple[int, int]:
    """(tokens charged against the budget, tokens computed) of `req`'s next chunk. A request no
    chunk of which has been dispatched is charged from position 0 ("prompt") or past the reuse
    the scheduler expects (`est_cached`, "uncached"); one already running, its rest."""
    fresh = req.state in (
        RequestState.WAITING,
        RequestState.PROPOSED,
        RequestState.LEASED,
        RequestState.ADMITTED,
    )
    if fresh and charge == "prompt":
        charged = budget_chunk(req.num_tokens, capacity, unit)
        if charged <= 0:
            return 0, 0
        return charged, shifted_end(
            req.num_scheduled_tokens, charged, req.num_tokens, unit
        ) - req.num_scheduled_tokens
    start = req.num_scheduled_tokens if req.state != RequestState.WAITING else est_cached
    charged = budget_chunk(req.num_tokens - start, capacity, unit)
    return charged, charged


class MicroBatchPlanner:
    """TensorRT-LLM's micro-batch scheduler over the plannable requests, FCFS: each gets the
    chunk `charge_of` gives it until the budget or the batch size runs out (a request whose
    chunk comes to 0 tokens, and every one after it, waits)."""

    name = "trtllm-microbatch"

    def __init__(self, config: PlannerConfig, mechanisms: TrtllmMechanisms, max_num_tokens: int):
        if mechanisms.budget_charge == "static":
            raise ValueError(
                "MicroBatchPlanner models 'prompt' or 'uncached' charging; 'static' is the static planner"
            )
        self.config, self.mech, self.max_num_tokens = config, mechanisms, max_num_tokens

    def plan(
        self, requests: Sequence[Request], admitting: Admitting = NOTHING_ADMITTING
    ) -> list[Chunk]:
        bs = self.config.block_size
        chunks: list[Chunk] = []
        left = self.max_num_tokens
        for req in requests:
            if len(chunks) >= self.mech.max_batch_size:
                break
            charged, computed = charge_of(req, left, bs, self.mech.budget_charge)
            if charged <= 0:
                break
            chunk = chunk_of(req, computed, bs)
            if chunk is None:
                break
            chunks.append(chunk)
            left -= charged
        return align_chunk_ends(chunks, requests, self.config, max(0, left))

    def observe(self, chunks, seconds: float) -> None:
        pass


# ---- per-run state: who gets admitted when, what is visible, what the walks cost -------------


class TrtllmScheduling:
    """The mechanisms' state in one `LoopSim` run (`loop="trtllm"`). All token counts in
    simulated tokens; `block_tokens` is TensorRT-LLM's tokens_per_block at that scale."""

    def __init__(
        self,
        mechanisms: TrtllmMechanisms,
        max_num_tokens: int,
        block_size: int,
        block_tokens: int,
        token_scale: int = 1,
    ):
        self.mech, self.max_num_tokens, self.token_scale = mechanisms, max_num_tokens, token_scale
        self.block_size, self.block_tokens = block_size, max(1, block_tokens)
        self._visible: set[int] = set()  # block hashes of retired requests
        self._pending: set[int] = set()  # block hashes admitted requests are computing
        self._original: dict[int, list[int]] = {}

    # admission
    def round_size(self, leader) -> int | None:
        """How many waiting requests the next microbatch takes (None: no limit, the earlier
        eager admission): the scheduler's budget after the chunks of the requests it runs."""
        if not self.mech.admit_on_schedule:
            return None
        bs, left, taken = self.block_size, self.max_num_tokens, 0
        ready = [r for r in leader.plannable if r.num_unscheduled_tokens > 0]
        for req in ready:
            charged, _ = charge_of(req, left, bs, self._charge())
            left -= charged
            taken += 1
        count = 0
        for req in leader.waiting:
            if taken + count >= self.mech.max_batch_size:
                break
            est = self._visible_blocks(req) * bs if self._charge() == "uncached" else 0
            charged, _ = charge_of(
                req, left, bs, self._charge(), est_cached=min(est, req.num_tokens - 1)
            )
            if charged <= 0:
                break
            left -= charged
            count += 1
        return count

    def hide_unretired(self, leader, limit: int | None) -> None:
        """Under `reuse_on_retire`, a waiting request's blocks from the first one that a request
        not yet retired is computing get hashes of their own: its walk does not find them and
        it computes them again.

            [0, k) retired or nobody's: as they are | [k, end) from the first pending block: its own
        """
        if not self.mech.reuse_on_retire:
            return
        for i, req in enumerate(leader.waiting):
            if limit is not None and i >= limit:
                break
            original = self._original.setdefault(req.request_id, list(req.block_hashes))
            k = next(
                (
                    j
                    for j, h in enumerate(original)
                    if h in self._pending and h not in self._visible
                ),
                len(original),
            )
            req.block_hashes = original[:k] + [
                hash((h, req.request_id, 0x7274)) for h in original[k:]
            ]

    def on_admit(self, req: Request) -> None:
        if self.mech.reuse_on_retire:
            self._pending.update(req.block_hashes)

    def on_retire(self, req: Request) -> None:
        if self.mech.reuse_on_retire:
            self._pending.difference_update(req.block_hashes)
            self._visible.update(self._original.pop(req.request_id, req.block_hashes))

    # the walks
    def scheduled_probe_s(self, fresh: Sequence[tuple[int, int]]) -> float:
        """Seconds of the walks of the requests new in a microbatch, as (cached, prompt) tokens;
        every rank pays them (each walks its own tree)."""
        if self.mech.probe_scope != "scheduled" or not self.mech.probe_on_executor:
            return 0.0
        return sum(self._walk_s(cached, total) for cached, total in fresh)

    def waiting_probe_s(self, leader) -> float:
        """Rank 0's scheduler walks every waiting request once per iteration ("waiting")."""
        if self.mech.probe_scope != "waiting" or not self.mech.probe_on_executor:
            return 0.0
        return sum(
            self._walk_s(self._visible_blocks(r) * self.block_size, r.num_tokens)
            for r in leader.waiting
        )

    def _walk_s(self, num_cached: int, num_tokens: int) -> float:
        if self.mech.probe == "constant":
            return self.mech.probe_s
        if self.mech.probe == "measured":
            matched = max(num_cached, self.block_tokens) * self.token_scale
            return self.mech.probe_s * matched / self.mech.probe_ref_tokens
        if self.mech.probe == "blocks":
            return self.mech.probe_block_s * blocks_walked(
                num_cached, num_tokens, self.block_tokens
            )
        return 0.0

    def _charge(self) -> str:
        return "uncached" if self.mech.budget_charge == "static" else self.mech.budget_charge

    def _visible_blocks(self, req: Request) -> int:
        """Leading blocks of `req` whose hashes a retired request stored (all, without
        `reuse_on_retire`: the pools alone decide)."""
        original = self._original.get(req.request_id, req.block_hashes)
        if not self.mech.reuse_on_retire:
            return len(original)
        k = 0
        while k < len(original) and original[k] in self._visible:
            k += 1
        return k
