"""Outside pipeline loops, step by step: TensorRT-LLM's and SGLang's executors in PP mode.

Each rank runs its host loop as a coroutine in virtual time; each rank's GPU runs the
batches its host launched, in order, once the activations from the rank before have arrived.
The host blocks where the real loop blocks (a receive from a neighbour, a GPU sync) and
spends the named host costs of `LoopCosts` where the real loop does that work. The
admission itself is the same leader and stage caches as every other system: rank 0's
scheduler runs the leader's round and plans the microbatch at once (the round's work is the
loop's `schedule` and per-rank `match`/`alloc` costs, charged on each rank's host).

TensorRT-LLM, `PyExecutor._executor_loop_pp` (tensorrt_llm/_torch/pyexecutor/py_executor.py),
per iteration on every rank, P microbatch slots:

    fetch      rank 0 reads the queue; the request list goes down the ranks (recv from k-1)
    schedule   rank 0 schedules and propagates (`_pp_schedule_and_propagate`: recv from k-1);
               every rank re-runs its scheduler and `prepare_resources` (its own KV
               allocation and reuse match)
    forward    activations from k-1; `_forward_step_inter_pp` synchronizes on the forward
               (non-last ranks); the last rank samples asynchronously
    sync       the previous microbatch's sampler event
    relay      sample state of slot mb+1 received from k-1 (rank 0: from the last rank) and
               sent on; the last rank sends slot mb-1's (`send/recv chain:
               (pp_size - 1) -> 0 -> 1 -> ... -> (pp_size - 2)`)
    finalize   slot mb+1 (the batch of P-1 iterations ago): requests updated, KV freed,
               in-flight ids removed (a request is in at most one in-flight microbatch)

SGLang, `SchedulerPPMixin.event_loop_pp` (python/sglang/srt/managers/scheduler_pp_mixin.py),
per microbatch slot on every rank:

    recv_requests      rank 0 from the tokenizer; others receive rank k-1's list (blocking)
    get_next_batch     every rank schedules over its own radix cache (match, allocate)
    run_batch          non-first ranks receive the hidden states' metadata (blocking), launch
    (last rank)        send the sampled ids to rank 0
    next slot          receive the outputs of slot mb+1 from the rank before (rank 0: from the
                       last rank; others: the carry rank k-1 sends one slot later) and process
                       them (a sync on those outputs)
    (not last rank)    send the carried outputs, the request list and the hidden states on

Chunks of one long request go in successive microbatches (SGLang's chunked pipeline
parallelism), so they may be in flight together.

Rank 0's leader decides every batch; the other ranks take its decision with the request list
(the real ranks reach the same decision by running the same scheduler on the same requests).
"""

from __future__ import annotations

import collections
import math
from dataclasses import replace

from wavepp.sched.messages import ReleaseMsg, TokenResult, Wave, WaveResult
from wavepp.sched.request import RequestState
from wavepp.sched.rounds import run_round
from wavepp.sim.core.pipeline import PipelineSim
from wavepp.sim.loops.loop_costs import LoopCosts
from wavepp.sim.loops.sglang import SglangScheduling
from wavepp.sim.loops.trtllm import TrtllmScheduling
from wavepp.sim.loops.virtual_channels import VirtualChannels

LOOPS = ("trtllm", "sglang")


class _Batch:
    """One microbatch (a leader wave) on its way through the ranks."""

    def __init__(self, wave: Wave, num_ranks: int):
        self.wave = wave
        self.ready = [False] * num_ranks  # activations arrived at rank k
        self.done_at: list[float | None] = [None] * num_ranks
        self.seconds: list[float] = []
        self.waiters: dict[int, list] = collections.defaultdict(list)  # rank -> coroutines
        self.fresh: list[tuple[int, int]] = []  # (cached, prompt) tokens of its new requests
        self.rank0_probe_s = 0.0  # rank 0's scheduler walks (probe_scope "waiting")
        self.match_s = 0.0  # every rank's radix walks (SGLang, "considered")


class LoopSim(PipelineSim):
    """A PipelineSim whose ranks run an outside executor loop (`loop`: trtllm | sglang), each
    rank a coroutine over `channels` (its sends, receives, sleeps and waits for work)."""

    def __init__(
        self,
        leader,
        servers,
        costs,
        *,
        loop: str,
        loop_costs: LoopCosts,
        check_integrity: bool = False,
        trtllm: TrtllmScheduling | None = None,
        sglang: SglangScheduling | None = None,
    ):
        if loop not in LOOPS:
            raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")
        super().__init__(
            leader, servers, costs, inline_admission=True, check_integrity=check_integrity
        )
        self.kind, self.lc = loop, loop_costs
        # TensorRT-LLM's mechanisms (sim/loops/trtllm.py)
        self.trtllm = trtllm if loop == "trtllm" else None
        self.sglang = (
            sglang if loop == "sglang" else None
        )  # SGLang's mechanisms (sim/loops/sglang.py)
        n = self.num_stages
        self._gpu_queue = [collections.deque() for _ in range(n)]
        self._gpu_busy = [False] * n
        self.iterations = [0] * n
        self.waves_sent: list[Wave] = []  # every microbatch rank 0 scheduled, in order
        self.channels = VirtualChannels(self.loop, loop_costs.hop_s, self._has_work)
        body = self._trtllm if loop == "trtllm" else self._sglang
        for rank in range(n):
            self.channels.start(body(rank))

    def _kick(self) -> None:
        """PipelineSim's kick (a request arrived, a round ended): wake rank 0's loop if idle."""
        self.channels.kick()

    def _has_work(self) -> bool:
        return bool(self.leader.has_waiting or self.leader.plannable or self.leader.waves_in_flight)

    # ---- the GPU of each rank ----------------------------------------------------------------

    def _gpu_sync(self, rank: int, batch: _Batch):
        def op(resume):
            if batch.done_at[rank] is not None:
                self.loop.after(0.0, resume)
            else:
                batch.waiters[rank].append(resume)

        return op

    def _launch(self, rank: int, batch: _Batch) -> None:
        if rank == 0:
            batch.ready[0] = True
        self._gpu_queue[rank].append(batch)
        self._gpu_run(rank)

    def _gpu_run(self, rank: int) -> None:
        queue = self._gpu_queue[rank]
        if self._gpu_busy[rank] or not queue or not queue[0].ready[rank]:
            return
        batch = queue.popleft()
        wave = batch.wave
        # the stage materializes the blocks when the batch's kernels run: the blocks it reuses
        # from a batch ahead of it are computed by then (GPU order)
        self.servers[rank].prepare(wave)
        shapes = [(c.start, c.num_tokens) for c in wave.chunks]
        seconds = self.costs.wave_seconds(rank, shapes) if shapes else 0.0
        seconds += self.costs.tier_seconds(self.servers[rank])
        start = self.loop.now
        self._gpu_busy[rank] = True
        self.stats[rank].busy_s += seconds
        self.stats[rank].num_waves += 1

        def finish():
            self._gpu_busy[rank] = False
            self.servers[rank].complete(wave)
            batch.done_at[rank] = self.loop.now
            batch.seconds.append(seconds)
            self.wave_spans.append((rank, wave.wave_id, start, self.loop.now))
            if rank + 1 < self.num_stages:

                def arrive():
                    batch.ready[rank + 1] = True
                    self._gpu_run(rank + 1)

                self.loop.after(self.costs.transfer_seconds(rank, wave.num_tokens), arrive)
            for resume in batch.waiters.pop(rank, []):
                resume()
            self._gpu_run(rank)

        self.loop.after(seconds, finish)

    # ---- rank 0's scheduler: the leader ------------------------------------------------------

    def _schedule(self) -> _Batch | None:
        """Admit what waits (one round, at once) and plan the next microbatch."""
        leader, now, hooks, sg = self.leader, self.loop.now, self.trtllm, self.sglang
        rank0_probe_s = hooks.waiting_probe_s(leader) if hooks else 0.0
        match_s = 0.0
        if leader.has_waiting and leader.round is None:
            limit = hooks.round_size(leader) if hooks else None
            if sg is not None:  # PrefillAdder walks each waiting request it looks at
                limit = sg.round_size(leader, self._matched_tokens)
                match_s = sg.considered_match_s(leader, limit, self._matched_tokens)
            if limit != 0:
                if hooks:
                    hooks.hide_unretired(leader, limit)
                self._admit(limit)
        fresh = {r.request_id for r in leader.plannable if r.state == RequestState.ADMITTED}
        wave = leader.plan_wave(now)
        if wave is None:
            return None
        self.waves_sent.append(wave)
        batch = _Batch(wave, self.num_stages)
        batch.rank0_probe_s, batch.match_s = rank0_probe_s, match_s
        batch.fresh = [
            (c.start, leader.requests[c.request_id].num_tokens)
            for c in wave.chunks
            if c.request_id in fresh
        ]
        return batch

    def _matched_tokens(self, req) -> int:
        """Tokens of `req`'s prefix that rank 0's cache holds (computed or being computed)."""
        return (
            self.servers[0].pool.match(req.block_hashes).num_blocks * self.leader.config.block_size
        )

    def _admit(self, limit: int | None) -> None:
        """One round over (at most `limit` of) the waiting requests, at once."""
        leader, now = self.leader, self.loop.now

        def exchange(msg):
            replies = [s.handle(msg) for s in self.servers]
            return None if isinstance(msg, ReleaseMsg) else replies

        config = leader.config
        if limit is not None:
            leader.config = replace(config, max_round_requests=limit)
        try:
            outcome = run_round(leader, exchange, lambda: now)
        finally:
            leader.config = config
        if outcome is not None:
            self.round_spans.append((outcome.round_id, now, now))
            for req in outcome.admitted:
                self.records[req.request_id].num_cached_tokens = req.num_cached_tokens
                if self.trtllm:
                    self.trtllm.on_admit(req)
        self._record_finished()

    def _retire(self, batch: _Batch) -> None:
        wave = batch.wave
        tokens = tuple(TokenResult(c.request_id, 0, 0.0) for c in wave.chunks if c.is_last)
        done = self.leader.on_wave_result(
            WaveResult(wave.wave_id, tokens, tuple(batch.seconds)), self.loop.now
        )
        if self.trtllm:
            for req in done:
                self.trtllm.on_retire(req)
        self._record_finished()

    def _prepare_s(self, batch: _Batch | None, rank: int = 0) -> float:
        """A rank's scheduler pass and prepare_resources over one microbatch: with TensorRT-LLM's
        probe modelled, the walks of its new requests (every rank) and rank 0's scheduler walks;
        else the per-block match of each reused prefix."""
        lc, hooks = self.lc, self.trtllm
        if batch is None:
            return lc.schedule_s
        seconds = lc.schedule_s + lc.schedule_item_s * len(batch.wave.chunks)
        for c in batch.wave.chunks:
            seconds += lc.alloc_block_s * math.ceil(c.num_tokens / lc.block_tokens)
        if hooks is not None and hooks.mech.probe != "none":
            seconds += hooks.scheduled_probe_s(batch.fresh) + (
                batch.rank0_probe_s if rank == 0 else 0.0
            )
            return seconds
        if self.sglang is not None and self.sglang.mech.match_scope == "considered":
            return seconds + batch.match_s
        for c in batch.wave.chunks:
            if (
                c.start
                and self.leader.requests.get(c.request_id) is not None
                and c.start == self.leader.requests[c.request_id].num_cached_tokens
            ):
                seconds += lc.match_block_s * (c.start // lc.block_tokens)
        return seconds

    # ---- the loops ---------------------------------------------------------------------------

    def _trtllm(self, rank: int):
        """PyExecutor._executor_loop_pp, one rank."""
        P, lc = self.num_stages, self.lc
        last = rank == P - 1
        prev_rank, next_rank = (rank - 1) % P, (rank + 1) % P
        slots: list[_Batch | None] = [None] * P
        mb = 0
        while True:
            # fetch: rank 0 reads the queue, the list goes down the chain
            if rank == 0:
                if all(s is None for s in slots):
                    yield self.channels.wait_for_work()
            else:
                yield self.channels.recv(rank - 1, rank, "fetch")
            yield self.channels.sleep(lc.fetch_s)
            if not last:
                self.channels.send(rank, rank + 1, "fetch", None)
            # schedule on rank 0, propagated; every rank runs its scheduler and prepare_resources
            if rank == 0:
                batch = self._schedule()
            else:
                batch = yield self.channels.recv(rank - 1, rank, "schedule")
            if not last:
                self.channels.send(rank, rank + 1, "schedule", batch)
            yield self.channels.sleep(self._prepare_s(batch, rank))
            self.iterations[rank] += 1
            slots[mb] = batch
            if batch is not None:
                self._launch(rank, batch)
                if not last and (self.trtllm is None or self.trtllm.mech.forward_sync):
                    yield self._gpu_sync(
                        rank, batch
                    )  # _forward_step_inter_pp: sampler_event.synchronize()
            previous = slots[(mb - 1) % P]
            if previous is not None:  # sync the previous microbatch's sampler event
                yield self._gpu_sync(rank, previous)
            # relay: (P-1) -> 0 -> 1 -> ... -> (P-2)
            previous = slots[(mb + (-1 if last else 1)) % P]
            if previous is not None:
                if not last:
                    yield self.channels.recv(prev_rank, rank, "sample")
                if rank != P - 2:
                    self.channels.send(rank, next_rank, "sample", previous)
                yield self.channels.sleep(lc.relay_s)
            # finalize the batch of P-1 iterations ago
            previous = slots[(mb + 1) % P]
            if previous is not None:
                yield self.channels.sleep(lc.finalize_s)
                if rank == 0:
                    self._retire(previous)
                slots[(mb + 1) % P] = None
            mb = (mb + 1) % P

    def _sglang(self, rank: int):
        """SchedulerPPMixin.event_loop_pp, one rank."""
        P, lc = self.num_stages, self.lc
        last = rank == P - 1
        slots: list[_Batch | None] = [None] * P
        carry: _Batch | None = None
        mb = 0
        while True:
            if rank == 0:
                if all(s is None for s in slots):
                    yield self.channels.wait_for_work()
                yield self.channels.sleep(lc.fetch_s)
                batch = self._schedule()
            else:
                batch = yield self.channels.recv(rank - 1, rank, "reqs")
                yield self.channels.sleep(lc.fetch_s)
            yield self.channels.sleep(self._prepare_s(batch, rank))
            self.iterations[rank] += 1
            slots[mb] = batch
            if batch is not None:
                if rank > 0:  # run_batch: the hidden states' metadata (blocking)
                    yield self.channels.recv(rank - 1, rank, "proxy")
                self._launch(rank, batch)
                if last:  # sampled ids to rank 0 (the data: when computed)
                    self.channels.send(rank, 0, "out", batch)
            following = slots[(mb + 1) % P]
            received = None
            if following is not None:
                src = P - 1 if rank == 0 else rank - 1
                received = yield self.channels.recv(src, rank, "out")
                if received is not following:
                    raise AssertionError(
                        f"rank {rank}: outputs of wave {received.wave.wave_id} "
                        f"for slot of wave {following.wave.wave_id}"
                    )
                yield self._gpu_sync(P - 1, following)  # process_batch_result syncs on them
                if rank == 0:  # ... which left the last rank's GPU a hop ago
                    yield self.channels.sleep(
                        max(0.0, following.done_at[P - 1] + lc.hop_s - self.loop.now)
                    )
                yield self.channels.sleep(lc.relay_s + lc.finalize_s)
                if rank == 0:
                    self._retire(following)
                slots[(mb + 1) % P] = None
            if not last:
                if carry is not None:
                    self.channels.send(rank, rank + 1, "out", carry)
                self.channels.send(rank, rank + 1, "reqs", batch)
                if batch is not None:
                    self.channels.send(rank, rank + 1, "proxy", batch)
                yield self.channels.sleep(lc.relay_s)
            carry = received
            mb = (mb + 1) % P
