"""A request as the leader sees it: its tokens, its hash chain, and where it is in its life.

    WAITING -> PROPOSED -> LEASED -> ADMITTED -> RUNNING -> DONE
                 (any step) -> FAILED (with a reason) | ABORTED

Token ranges of an admitted request (all half-open, in tokens):

    [0, num_cached_tokens)                      reused: leased on every stage
    [num_cached_tokens, num_scheduled_tokens)   in chunks already dispatched in waves
    [num_scheduled_tokens, num_tokens)          still to plan
    num_computed_tokens <= num_scheduled_tokens: chunks that came back from the last stage
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from wavepp.cache import hash_blocks
from wavepp.sched.messages import Chunk, ProbeItem, PromptLogprobs, TokenResult


class RequestState(enum.Enum):
    WAITING = "waiting"
    PROPOSED = "proposed"  # in an admission round, probing
    LEASED = "leased"  # prefix agreed; lease, escrow and commit asked of every stage
    ADMITTED = "admitted"  # committed on every stage; plannable
    RUNNING = "running"  # at least one chunk dispatched
    DONE = "done"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def finished(self) -> bool:
        return self in (RequestState.DONE, RequestState.FAILED, RequestState.ABORTED)


@dataclass(frozen=True)
class Dependency:
    """This request reads blocks that request `owner_id` computes: it may be planned only in a
    wave after the one that dispatched the owner's tokens up to `num_tokens`."""

    owner_id: int
    num_tokens: int


@dataclass(eq=False)
class Request:
    request_id: int
    token_ids: tuple[int, ...]
    block_hashes: list[int]
    arrival_time: float = 0.0
    state: RequestState = RequestState.WAITING
    num_cached_tokens: int = 0
    num_scheduled_tokens: int = 0
    num_computed_tokens: int = 0
    num_rounds: int = 0
    num_idle_failures: int = 0  # admission failures in a row with nothing else running
    dependencies: list[Dependency] = field(default_factory=list)
    failure: str | None = None
    admitted_time: float | None = None
    finish_time: float | None = None
    round_time: float | None = None  # when it first entered an admission round
    dispatch_time: float | None = None  # when its first chunk went out in a wave
    priority: int = 0  # lower is more urgent (vLLM's); used under the priority policy
    seq: int = 0  # arrival order at the leader (its waiting queue's tie-break)
    result: TokenResult | None = None  # the first token, once DONE
    # prompt logprobs: positions [logprob_start, num_tokens - 1) are computed (never reused from
    # the cache) and the logprob of each next prompt token comes back, chunk by chunk
    logprob_start: int | None = None
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)
    # KV hand-off: the transfer id its last chunk carries to every stage (None: no export)
    export_id: str | None = None

    @classmethod
    def create(
        cls,
        request_id: int,
        token_ids,
        block_size: int,
        *,
        arrival_time: float = 0.0,
        extra_keys: bytes = b"",
        salt: bytes = b"",
    ) -> "Request":
        """Hash the prompt once, on arrival."""
        tokens = tuple(int(t) for t in token_ids)
        if not tokens:
            raise ValueError(f"request {request_id}: empty prompt (at least one token is needed)")
        hashes = hash_blocks(tokens, block_size, extra_keys=extra_keys, salt=salt)
        return cls(request_id, tokens, list(hashes), arrival_time)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def probe_item(self) -> ProbeItem:
        """What a probe asks every stage of this request: its block hashes and length."""
        return ProbeItem(self.request_id, tuple(self.block_hashes), self.num_tokens)

    @property
    def num_unscheduled_tokens(self) -> int:
        return self.num_tokens - self.num_scheduled_tokens

    def reset_progress(self) -> None:
        """Forget the agreed prefix and every chunk: the request holds nothing on any stage."""
        self.num_cached_tokens = self.num_scheduled_tokens = self.num_computed_tokens = 0
        self.dependencies = []
        self.prompt_logprobs = []

    def num_blocks(self, block_size: int) -> int:
        return -(-self.num_tokens // block_size)

    def max_reusable_blocks(self, block_size: int) -> int:
        """At least one token is always computed, so the first token can be produced: a fully
        cached prompt recomputes its last block. With prompt logprobs, reuse stops at the
        block holding logprob_start (the blocks before it are still reused):

            [0, k * block_size)  reused  |  [k * block_size, num_tokens)  computed, logprob_start inside
        """
        limit = self.num_tokens - 1
        if self.logprob_start is not None:
            limit = min(limit, self.logprob_start)
        return limit // block_size

    def logprob_token_ids(self, start: int, end: int) -> tuple[int | None, tuple[int, ...]]:
        """What a chunk [start, end) asks of the last stage for prompt logprobs: the first
        position and the next prompt token of each position from there (none past the prompt)."""
        if self.logprob_start is None or self.logprob_start >= end:
            return None, ()
        first = max(start, self.logprob_start)
        return first, self.token_ids[first + 1 : min(end, self.num_tokens - 1) + 1]

    def chunk(self, start: int, end: int) -> Chunk:
        """The chunk [start, end) of this request, with what its positions carry: the prompt
        logprobs it asks for, and on the last chunk the KV export id."""
        logprob_start, logprob_token_ids = self.logprob_token_ids(start, end)
        is_last = end == self.num_tokens
        return Chunk(
            self.request_id,
            start,
            end,
            is_last,
            logprob_start,
            logprob_token_ids,
            self.export_id if is_last else None,
        )
