"""The pipeline in virtual time: the real Leader and StageServers, with charged costs.

Each rank has two servers, as in the runtime:

    LOOP  runs waves in order: prepare -> compute (charged) -> complete -> send on
    WAVE  answers admission rounds at once, beside LOOP (asynchronous policies)

Under an inline-admission policy (lockstep) there is no WAVE: rank 0's LOOP runs a whole
round before it launches the next wave whenever requests wait, and every other stage answers
round messages on its LOOP between waves, so a busy stage answers late.

Rank 0 is the leader and stage 0. Waves go 0 -> 1 -> ... -> S-1; the last stage returns the
result to rank 0.

A central scheduler with one block pool (vLLM's pipeline parallelism) is the case of fewer
stage servers than execution stages: `num_stages` > len(servers). Stages without a server
only compute; the servers (stage 0's) answer rounds and prepare and complete the waves.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Sequence, cast

from wavepp.sched.leader import Leader
from wavepp.sched.messages import LeaseMsg, ReleaseMsg, TokenResult, Wave, WaveResult
from wavepp.sched.rounds import round_messages
from wavepp.sched.stage_server import StageServer
from wavepp.sched.stats import StageStats
from wavepp.sim.core.events import EventLoop
from wavepp.sim.core.shared_store import SimStoreLink

ChunkShape = tuple[int, int]  # (num_cached, num_new)


@dataclass(frozen=True)
class SimCosts:
    wave_seconds: Callable[[int, Sequence[ChunkShape]], float]  # (stage id, chunks) -> compute s
    # activations of a wave of num_tokens from stage `stage_id` to the next: (stage id, tokens)
    transfer_seconds: Callable[[int, int], float] = lambda stage_id, num_tokens: 0.0
    result_seconds: float = 0.0  # last stage -> rank 0
    host_link_bytes_s: float = 0.0  # a stage's host (CPU) link, one direction; 0: no host tier
    store_link_bytes_s: float = 0.0  # a stage's link to the shared store, one direction
    store_fetch_latency_s: float = 0.0  # a fetch's fixed cost (the store's lookup, the read set up)
    round_latency_s: float = 0.0  # one way, rounds plane
    round_msg_s: float = 0.0  # a stage's work per round message
    round_item_s: float = 0.0  # ... plus per request in it
    round_leased_block_s: float = 0.0  # lease: per block pinned (the lease message)
    round_new_block_s: float = 0.0  # escrow + commit: per new block (the lease message)
    leader_item_s: float = 0.0  # the leader's work per request per phase

    def host_seconds(self, num_bytes: int) -> float:
        """Time of `num_bytes` over a stage's host link: the blocks it loaded from its host
        tier and offloaded to it since its last wave, which the next wave waits for."""
        return num_bytes / self.host_link_bytes_s if num_bytes else 0.0

    def store_seconds(self, num_fetches: int, num_bytes: int) -> float:
        """Time of `num_fetches` fetches of `num_bytes` in all from the shared store."""
        if not num_bytes and not num_fetches:
            return 0.0
        if num_bytes and not self.store_link_bytes_s:
            raise ValueError("SimCosts: a stage fetched from the store with no store link")
        seconds = num_bytes / self.store_link_bytes_s if num_bytes else 0.0
        return seconds + num_fetches * self.store_fetch_latency_s

    def tier_seconds(self, server: StageServer) -> float:
        """What the stage's next wave waits for, beside its compute: the bytes its host tier
        moved (loads and offloads, `host_seconds`) and the fetches it took from the shared store
        (`store_seconds`) since its last wave. The store's puts are counted, never charged: the
        runtime copies the blocks out at `complete` and a writer thread stores them beside the
        compute loop, while a fetch runs on the thread answering the round, under the stage's
        lock, before the request's first wave there."""
        seconds = self.host_seconds(server.tiers.take_host_bytes())
        tier = server.tiers.store
        if tier is not None:
            moved = tier.take_transferred_bytes()  # both directions since the last wave here
            num_fetches, put_bytes = cast(SimStoreLink, tier.store).take_counts()
            seconds += self.store_seconds(num_fetches, moved - put_bytes)
        return seconds

    def message_seconds(self, msg, reply=None) -> float:
        """A stage's work to answer one rounds-plane message. Lease items pay per block only
        when the stage leased, escrowed and committed them (`reply`); a refusal is a quick
        check. A lease item is two requests' worth of per-item work (the lease with its escrow,
        then the commit), as when the commit was an exchange of its own."""
        if isinstance(msg, LeaseMsg):
            ok = {r.request_id for r in reply.results if r.ok} if reply is not None else None
            blocks = sum(
                self.round_leased_block_s * i.num_leased_blocks
                + self.round_new_block_s * i.num_new_blocks
                for i in msg.items
                if ok is None or i.request_id in ok
            )
            return self.round_msg_s + 2 * self.round_item_s * len(msg.items) + blocks
        return self.round_msg_s + self.round_item_s * len(msg)


@dataclass
class SimRecord:
    arrival: float
    finish: float | None = None
    num_tokens: int = 0
    num_cached_tokens: int = 0
    failure: str | None = None


class _Stage:
    def __init__(self, sid: int):
        self.sid = sid
        self.queue: collections.deque = collections.deque()  # ("wave", wave) | ("round", fn)
        self.busy = False
        self.idle_since = 0.0


class PipelineSim:
    def __init__(
        self,
        leader: Leader,
        servers: Sequence[StageServer],
        costs: SimCosts,
        *,
        inline_admission: bool,
        check_integrity: bool = False,
        on_finish: Callable[[int, float], None] | None = None,
        num_stages: int | None = None,
    ):
        self.leader = leader
        self.servers = list(servers)
        self.num_stages = num_stages or len(self.servers)
        if self.num_stages < len(self.servers):
            raise ValueError(f"{len(self.servers)} stage servers for {self.num_stages} stages")
        self.costs = costs
        self.inline = inline_admission
        self.loop = EventLoop()
        self.stats = [StageStats() for _ in range(self.num_stages)]
        self.records: dict[int, SimRecord] = {}
        self.wave_spans: list[tuple[int, int, float, float]] = []  # (stage, wave id, start, end)
        self.round_spans: list[tuple[int, float, float]] = []  # (round id, start, end)
        self._stages = [_Stage(s) for s in range(self.num_stages)]
        self._check = check_integrity
        self.on_finish = on_finish  # (request id, time) after a request ends
        self._round_active = False  # an admission round is under way
        self._rank0_blocked = False  # rank 0's LOOP is inside an inline round
        self._wave_seconds: dict[int, list[float]] = collections.defaultdict(list)

    # ---- driving -----------------------------------------------------------------------------

    def submit(
        self, request_id: int, token_ids, at: float | None = None, priority: int = 0
    ) -> None:
        def arrive():
            req = self.leader.add_request(request_id, token_ids, self.loop.now, priority=priority)
            self.records[request_id] = SimRecord(self.loop.now, num_tokens=req.num_tokens)
            self._record_finished()
            self._kick()

        if at is None:
            arrive()
        else:
            self.loop.at(at, arrive)

    def run(self, until: float = float("inf")) -> float:
        after = self._check_all if self._check else None
        self.loop.run(until=until, after_event=after)
        return self.loop.now

    @property
    def next_event_s(self) -> float:
        """When this pipeline next has something to do (inf when it is idle): what a driver of
        several pipelines on one clock advances them by (sim/studies/replicas.py)."""
        return self.loop.next_time

    # ---- rank 0 ------------------------------------------------------------------------------

    def _kick(self) -> None:
        if not self.inline and not self._round_active and self.leader.has_waiting:
            self._start_round()
        self._rank0_step()

    def _rank0_step(self) -> None:
        """Rank 0's LOOP, when free: (inline: a round first) then the next wave."""
        st = self._stages[0]
        if st.busy or self._rank0_blocked:
            return
        if self.inline and self.leader.has_waiting and not self._round_active:
            self._account_idle(0)
            self._rank0_blocked = True
            st.idle_since = self.loop.now
            self._start_round()
            return
        wave = self.leader.plan_wave(self.loop.now)
        if wave is not None:
            self._enqueue(0, ("wave", wave))

    # ---- admission ---------------------------------------------------------------------------

    def _start_round(self) -> None:
        self._round_active = True
        self._round_t0 = self.loop.now
        self._advance_round(round_messages(self.leader, lambda: self.loop.now), None, start=True)

    def _advance_round(self, steps, replies, start: bool = False) -> None:
        """Send the round's next message to every stage; go on when they all answered."""
        try:
            msg = next(steps) if start else steps.send(replies)
        except StopIteration as stop:
            self._end_round(stop.value)
            return
        if isinstance(msg, ReleaseMsg):
            self._broadcast(msg, None)
            self._advance_round(steps, None)
        else:
            self._broadcast(msg, lambda replies: self._advance_round(steps, replies))

    def _end_round(self, outcome) -> None:
        self._round_active = False
        if outcome is None:  # nothing was ready to enter a round
            self._rank0_blocked = False
            return
        self.round_spans.append((outcome.round_id, self._round_t0, self.loop.now))
        for req in outcome.admitted:
            self.records[req.request_id].num_cached_tokens = req.num_cached_tokens
        self._record_finished()
        if self._rank0_blocked:
            self._rank0_blocked = False
            self.stats[0].idle_admission_s += self.loop.now - self._stages[0].idle_since
            self._stages[0].idle_since = self.loop.now
        self._kick()

    def _broadcast(self, msg, on_replies) -> None:
        """Send `msg` to every stage; call on_replies(list) when all have answered. A stage
        handles the message when it takes it up, is busy for the work that took (known from
        its reply: a failed escrow stops early), then the reply travels back."""
        leader_s = self.costs.leader_item_s * len(msg)
        replies: list = []
        c = self.costs

        def handle(sid: int):
            reply = self.servers[sid].handle(msg)
            return reply, c.message_seconds(msg, reply)

        def deliver(reply) -> None:
            if on_replies is None:
                return
            replies.append(reply)
            if len(replies) == len(self.servers):
                self.loop.after(leader_s, lambda: on_replies(replies))

        for sid in range(len(self.servers)):
            hop = 0.0 if sid == 0 else c.round_latency_s
            if self.inline and sid != 0:
                # answered on the stage's LOOP, between its waves; the reply travels back
                def arrive(sid=sid, hop=hop):
                    self._enqueue(
                        sid,
                        (
                            "round",
                            lambda: handle(sid),
                            lambda reply: self.loop.after(hop, lambda: deliver(reply)),
                        ),
                    )
            else:

                def arrive(sid=sid, hop=hop):
                    reply, work = handle(sid)
                    self.loop.after(work + hop, lambda: deliver(reply))

            self.loop.after(hop, arrive)

    # ---- execution ---------------------------------------------------------------------------

    def _enqueue(self, sid: int, item) -> None:
        st = self._stages[sid]
        st.queue.append(item)
        if not st.busy:
            self._serve(sid)

    def _serve(self, sid: int) -> None:
        st = self._stages[sid]
        if st.busy or not st.queue:
            return
        self._account_idle(sid)
        kind, *rest = st.queue.popleft()
        st.busy = True
        if kind == "round":
            handle, done = rest
            reply, work = handle()
            self.stats[sid].round_s += work

            def finish_round():
                st.busy = False
                st.idle_since = self.loop.now
                done(reply)
                self._serve(sid)

            self.loop.after(work, finish_round)
            return
        wave: Wave = rest[0]
        server = self.servers[sid] if sid < len(self.servers) else None
        if server is not None:
            server.prepare(wave)
        shapes = [(c.start, c.num_tokens) for c in wave.chunks]
        seconds = self.costs.wave_seconds(sid, shapes) if shapes else 0.0
        if server is not None:
            seconds += self.costs.tier_seconds(server)
        start = self.loop.now
        self.stats[sid].busy_s += seconds
        self.stats[sid].num_waves += 1

        def finish_wave():
            if server is not None:
                server.complete(wave)
            self.wave_spans.append((sid, wave.wave_id, start, self.loop.now))
            st.busy = False
            st.idle_since = self.loop.now
            self._wave_seconds[wave.wave_id].append(seconds)
            if sid + 1 < self.num_stages:
                delay = self.costs.transfer_seconds(sid, wave.num_tokens)
                self.loop.after(delay, lambda: self._enqueue(sid + 1, ("wave", wave)))
            else:
                self.loop.after(self.costs.result_seconds, lambda: self._wave_done(wave))
            if sid == 0:
                self._rank0_step()
            self._serve(sid)

        self.loop.after(seconds, finish_wave)

    def _wave_done(self, wave: Wave) -> None:
        tokens = tuple(TokenResult(c.request_id, 0, 0.0) for c in wave.chunks if c.is_last)
        result = WaveResult(wave.wave_id, tokens, tuple(self._wave_seconds.pop(wave.wave_id)))
        self.leader.on_wave_result(result, self.loop.now)
        self._record_finished()
        self._kick()

    def abort(self, request_id: int) -> None:
        """Abort a request now (at any step of its life)."""
        self.leader.abort(request_id, self.loop.now)
        self._record_finished()
        self._kick()

    def _record_finished(self) -> None:
        for req in self.leader.take_finished():
            rec = self.records[req.request_id]
            rec.finish = self.loop.now
            rec.failure = req.failure
            if self.on_finish is not None:
                self.on_finish(req.request_id, self.loop.now)

    def _account_idle(self, sid: int) -> None:
        st = self._stages[sid]
        if st.busy:
            return
        gap = self.loop.now - st.idle_since
        if gap <= 0:
            return
        starving = self._round_active and not self.leader.plannable
        if starving or (sid == 0 and self._rank0_blocked):
            self.stats[sid].idle_admission_s += gap
        else:
            self.stats[sid].idle_input_s += gap
        st.idle_since = self.loop.now

    def _check_all(self) -> None:
        for server in self.servers:
            server.pool.check_integrity()
            if server.pool.host_tier is not None:
                server.pool.host_tier.check_integrity()
            if server.tiers.store is not None:
                cast(SimStoreLink, server.tiers.store.store).shared.check_integrity()
