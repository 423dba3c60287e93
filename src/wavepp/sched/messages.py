"""Typed messages between the leader and the stages.

Rounds plane (admission), one round = two exchanges, each sent to every stage:

    leader                              stage s (StageServer)
    ProbeMsg(items: hashes)     ->      hint: longest prefix present      -> ProbeReply
    LeaseMsg(items: k, blocks)  ->      lease k blocks, escrow room for   -> LeaseReply
                                        the rest, commit it (its new
                                        blocks become pending entries)
    ReleaseMsg(request ids)     ->      give back everything (no reply)

A request is admitted when every stage leased, escrowed and committed it; the others go out
in a ReleaseMsg to every stage before the round ends (before any later round probes), so the
pending entries a refused request registered on some stages are never seen by another
request. The stage commits right after its escrow: nothing can claim a victim in between, and
the exchange a separate commit would take is one round trip less on every admission.

Data plane: a Wave header travels with the activations, stage 0 -> 1 -> ... -> S-1; the last
stage sends a WaveResult back to the leader.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wavepp.cache import CapacityView


@dataclass(frozen=True)
class ProbeItem:
    request_id: int
    block_hashes: tuple[int, ...]
    num_tokens: int


@dataclass(frozen=True)
class ProbeMsg:
    round_id: int
    items: tuple[ProbeItem, ...]

    def __len__(self) -> int:
        return len(self.items)

    def empty_reply(self, stage_id: int) -> "ProbeReply":
        return ProbeReply(self.round_id, stage_id, ())


@dataclass(frozen=True)
class Hint:
    request_id: int
    num_blocks: int  # longest prefix present (computed or pending)
    snapshot_blocks: tuple[
        int, ...
    ] = ()  # hybrid models: boundaries (in blocks) with a recurrent snapshot
    # hybrid models on a SnapshotPool: snapshots at every grid point up to num_grid_snapshot_blocks
    # (multiples of snapshot_interval_blocks), and at num_end_snapshot_blocks if > 0
    snapshot_interval_blocks: int = 0
    num_grid_snapshot_blocks: int = 0
    num_end_snapshot_blocks: int = 0
    # of num_blocks, the runs this stage holds below its pool: in its host tier, then in the
    # shared store (the rest is in its pool)
    num_host_blocks: int = 0
    num_store_blocks: int = 0

    def snapshot_set(self) -> set[int]:
        """Every boundary (in blocks) this hint says holds a snapshot."""
        found = set(self.snapshot_blocks)
        if self.snapshot_interval_blocks:
            found.update(
                range(
                    self.snapshot_interval_blocks,
                    self.num_grid_snapshot_blocks + 1,
                    self.snapshot_interval_blocks,
                )
            )
        if self.num_end_snapshot_blocks:
            found.add(self.num_end_snapshot_blocks)
        return found


@dataclass(frozen=True)
class ProbeReply:
    round_id: int
    stage_id: int
    hints: tuple[Hint, ...]


@dataclass(frozen=True)
class LeaseItem:
    request_id: int
    num_leased_blocks: int  # agreed prefix, in blocks
    num_new_blocks: int  # room to escrow for the rest of the prompt


@dataclass(frozen=True)
class LeaseMsg:
    round_id: int
    items: tuple[LeaseItem, ...]

    def __len__(self) -> int:
        return len(self.items)

    def empty_reply(self, stage_id: int) -> "LeaseReply":
        return LeaseReply(self.round_id, stage_id, ())


@dataclass(frozen=True)
class ItemResult:
    request_id: int
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class LeaseReply:
    round_id: int
    stage_id: int
    results: tuple[ItemResult, ...]
    capacity: CapacityView | None = None  # the stage's blocks by state after the commits


@dataclass(frozen=True)
class ReleaseMsg:
    request_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.request_ids)


@dataclass(frozen=True)
class Chunk:
    """Tokens [start, end) of one request, computed in one wave."""

    request_id: int
    start: int
    end: int
    is_last: bool  # end == the request's num_tokens: the last stage samples its first token
    # prompt logprobs: the last stage returns the logprob of each id of `logprob_token_ids`
    # at the positions [logprob_start, logprob_start + len(logprob_token_ids)) of this chunk
    # (the token id that follows each position in the prompt)
    logprob_start: int | None = None
    logprob_token_ids: tuple[int, ...] = ()
    # the last chunk of a request that hands its KV to a decode engine: each stage writes its
    # layers' KV of tokens [0, end) under this id once the chunk ran there (kv_transfer/)
    export_id: str | None = None

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Wave:
    """One micro-batch: every stage runs it, in wave order. `release_ids`: requests the leader
    aborted after admission; each stage frees them after running this wave (ordering with
    the chunks already in flight is then free)."""

    wave_id: int
    chunks: tuple[Chunk, ...]
    release_ids: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


@dataclass(frozen=True)
class TokenResult:
    request_id: int
    token_id: int
    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class PromptLogprobs:
    """Logprobs of a request's prompt tokens computed by one chunk: at position `start + i`,
    the logprob of the prompt's next token `logprobs[i]`, and that position's top tokens."""

    request_id: int
    start: int
    logprobs: tuple[float, ...]
    top_ids: tuple[tuple[int, ...], ...] = ()
    top_logprobs: tuple[tuple[float, ...], ...] = ()


@dataclass(frozen=True)
class WaveResult:
    wave_id: int
    tokens: tuple[TokenResult | PromptLogprobs, ...]
    stage_seconds: tuple[float, ...] = field(default=())  # measured compute time per stage
