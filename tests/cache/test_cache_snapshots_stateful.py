"""Random admit / publish / abort / evict sequences against a SnapshotPool, checked after every
step: no leaked snapshot slot, no snapshot without its block, slot memory accounted exactly, and
a leased snapshot's slot never handed to another request."""

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from wavepp.cache import PendingBlockError, hash_blocks
from wavepp.cache.snapshot_plan import snapshot_boundaries
from wavepp.cache.snapshots import SnapshotPool

from .snapshot_machines import Model, prompts_from

B = 2
BASES = (list(range(100, 120)), list(range(200, 220)), [7] * 20)

prompts = prompts_from(BASES, [20, 16, 12, 8, 4, 10, 6, 2, 0], 7)


class SnapshotMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[int, Model] = {}
        self.next_id = 0
        self.slot_content: dict[int, int] = {}  # slot -> hash of the block whose state it holds

    @initialize(
        num_blocks=st.integers(4, 40), num_slots=st.integers(2, 12), interval=st.integers(1, 3)
    )
    def setup(self, num_blocks, num_slots, interval):
        self.pool = SnapshotPool(
            num_blocks, B, num_slots=num_slots, interval_blocks=interval, bytes_per_snapshot=10
        )

    @rule(prompt=prompts)
    def admit(self, prompt):
        """Probe, agree on the longest prefix ending at a snapshot, lease, escrow blocks and slots, commit."""
        pool, hashes = self.pool, hash_blocks(prompt, B)
        cap = (len(prompt) - 1) // B
        k = min(pool.match(hashes).num_computed_blocks, cap)
        k = pool.match_snapshots(hashes, k).num_blocks
        request_id, self.next_id = self.next_id, self.next_id + 1
        lease = pool.lease(request_id, hashes, k)
        if not lease.ok:  # the blocks are escrow victims of committed requests
            assert not pool.has_request(request_id) and "escrow" in lease.reason, lease.reason
            return
        num_new = -(-len(prompt) // B) - k
        boundaries = snapshot_boundaries(k, len(prompt), B, pool.interval_blocks)
        if (
            not pool.reserve(request_id, num_new).ok
            or not pool.reserve_snapshots(request_id, boundaries).ok
            or not pool.commit(request_id, hashes[k:]).ok
        ):
            pool.release(request_id)
            return
        if k:
            slot = pool.snapshot_plan(request_id).leased.slot
            assert self.slot_content[slot] == hashes[k - 1], "resumed from another block's state"
        self.requests[request_id] = Model(hashes, len(prompt), k, "committed")

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def advance(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.requests)))
        model = self.requests[request_id]
        if model.phase == "committed":
            try:
                self.pool.materialize(request_id)
            except PendingBlockError:
                return
            model.phase = "materialized"
            model.num_published = model.num_leased * B
        elif model.num_published < model.num_tokens:
            end = data.draw(st.integers(model.num_published + 1, model.num_tokens))
            plan = self.pool.snapshot_plan(request_id)
            for boundary, slot in plan.save_slots().items():  # what the model writes in the chunk
                if model.num_published < boundary * B <= end:
                    self.slot_content[slot] = model.hashes[boundary - 1]
            try:
                self.pool.publish(request_id, end)
            except PendingBlockError:
                return
            model.num_published = end
        else:
            self.pool.free(request_id)
            del self.requests[request_id]

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def abort(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.requests)))
        self.pool.release(request_id)
        del self.requests[request_id]

    @invariant()
    def consistent(self):
        if not hasattr(self, "pool"):
            return
        self.pool.check_integrity()
        for block_hash, snap in self.pool._snapshots.items():
            if snap.computed:
                assert self.slot_content.get(snap.slot) == block_hash, (
                    "a snapshot's slot holds another state"
                )

    def teardown(self):
        if not hasattr(self, "pool"):
            return
        for request_id in list(self.requests):
            self.pool.release(request_id)
        self.pool.check_integrity()
        assert self.pool.num_free_slots + self.pool.num_snapshots == self.pool.num_slots
        assert all(s.ref_count == 0 for s in self.pool._snapshots.values())


SnapshotMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_snapshot_machine = SnapshotMachine.TestCase
