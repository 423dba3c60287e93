"""Rank 0's KV cache events: what every stage's pool recorded, turned into the events of the
blocks held on all stages, handed to the publisher.

    feed = KVEventsFeed(num_stages, block_size, publisher)
    queries = CacheQueries(..., block_changes=feed)   # every cache query carries the changes
    feed.start(queries.poll)       # the FEED thread asks every POLL_INTERVAL_S besides
    feed.note_prompt(req) / feed.end_prompt(req)     (the core, at submit and at the end)
    feed.clear()                   (the core's reset, with the cache queries held)
    feed.close()

The stages' changes come back on the cache queries' plane pair (runtime/cache_queries.py):
each stage's QUERY thread drains its pool's BlockLog into its answer, so the compute loops
send nothing and wait for nothing; any cache query (a router's, /metrics') carries them, and the
FEED thread asks when nobody else did. Everything here runs under one lock of its own, never
the engine's, and publishing never blocks (publisher.py). A batch the publisher dropped (its
queue was full) is made good by the next one: AllBlocksCleared and the whole announced set,
parents first (what vLLM's stream leaves to the subscriber's replay, which cannot give back a
batch that never went out).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from wavepp.cache.block_log import BlockChanges
from wavepp.kv_events.all_stage_blocks import AllStageBlocks

POLL_INTERVAL_S = 0.25  # how stale an event may be, at most, beside the query's own time
# An idle engine changes no pool (blocks are published and evicted only for requests, or for
# a chunk still in flight after its request ended): it is asked this often, and at every
# interval while a request is live or for SETTLE_S after the last one ended.
IDLE_POLL_INTERVAL_S = 1.0
SETTLE_S = 2.0


class KVEventsFeed:
    def __init__(
        self,
        num_stages: int,
        block_size: int,
        publisher,
        interval_s: float = POLL_INTERVAL_S,
        hybrid: bool = False,
    ):
        """`publisher`: an EventPublisher (or anything with publish(events) -> bool); `hybrid`:
        the model resumes only at state snapshots (AllStageBlocks)."""
        self.blocks = AllStageBlocks(num_stages, block_size, hybrid=hybrid)
        self.publisher = publisher
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._restate = False  # a batch was dropped: the next one restates the whole set
        self._num_live = 0  # prompts noted and not ended
        self._last_end = 0.0  # time.monotonic() of the last end
        self.num_restatements = 0

    def start(self, poll: Callable[[], object]) -> None:
        """Start the FEED thread: `poll()` (a cache query of no prompt) every interval; it ends
        at close() or when poll raises (the engine stopped)."""
        self._thread = threading.Thread(
            target=self._run, args=(poll,), name="kv-events-feed", daemon=True
        )
        self._thread.start()

    def note_prompt(self, req) -> None:
        """A request arrived (a sched Request: its block hashes and token ids)."""
        with self._lock:
            self.blocks.note_prompt(req.block_hashes, req.token_ids)
            self._num_live += 1
            self._publish()

    def end_prompt(self, req) -> None:
        with self._lock:
            self.blocks.end_prompt(req.block_hashes)
            self._num_live -= 1
            self._last_end = time.monotonic()

    def mark(self) -> int:
        """Before a cache query drains the stages (AllStageBlocks.mark)."""
        with self._lock:
            return self.blocks.mark()

    def apply(self, stage_changes: list[tuple[int, BlockChanges]], mark: int) -> None:
        """A cache query's answers, every stage's in order: apply them and publish."""
        with self._lock:
            self.blocks.apply(stage_changes, mark)
            self._publish()

    def clear(self) -> None:
        """Every stage's cache was emptied: AllBlocksCleared goes out."""
        with self._lock:
            self.blocks.clear()
            self._publish()

    def counts(self) -> dict[str, int]:
        """The publisher's counters, and the blocks announced now (for /metrics)."""
        publisher = self.publisher
        with self._lock:
            num_announced = self.blocks.num_announced
        return {
            "published_batches": publisher.num_published,
            "published_events": publisher.num_events,
            "dropped_batches": publisher.num_dropped,
            "queued_batches": publisher.num_queued,
            "announced_blocks": num_announced,
        }

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.publisher.close()

    def _run(self, poll: Callable[[], object]) -> None:
        last_poll = 0.0
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            with self._lock:
                busy = self._num_live > 0 or now - self._last_end < SETTLE_S
            if not busy and now - last_poll < IDLE_POLL_INTERVAL_S:
                continue
            last_poll = now
            try:
                poll()
            except Exception:  # the engine stopped (EngineError) or a stage is gone
                return

    def _publish(self) -> None:
        if self._restate:
            events: list = self.blocks.restatement()
        else:
            events = self.blocks.take_events()
            if not events:
                return
        if self.publisher.publish(events):
            self.num_restatements += self._restate
            self._restate = False
        else:
            self._restate = True
