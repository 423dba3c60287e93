"""Random admit / materialize / publish / abort / evict sequences against a SnapshotPool whose
requests lease pending blocks and pending snapshots, checked after every step: no leaked or
doubly held slot, a pending snapshot only on its owner's pending block, a dead one held only by
its readers, and every request that resumes reads the state of exactly the block it resumes
after, written by the request that computed it."""

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from wavepp.cache import PendingBlockError, hash_blocks
from wavepp.cache.snapshot_plan import snapshot_boundaries
from wavepp.cache.snapshots import SnapshotPool

from .snapshot_machines import Model, prompts_from

B = 2
BASES = (list(range(100, 124)), list(range(200, 224)))

prompts = prompts_from(BASES, [24, 16, 12, 8, 5, 4, 0], 6)


class PendingSnapshotMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[int, Model] = {}
        self.next_id = 0
        self.slot_content: dict[int, int] = {}  # slot -> hash of the block whose state it holds
        self.num_pending_leases = 0

    @initialize(
        num_blocks=st.integers(6, 48), num_slots=st.integers(3, 14), interval=st.integers(1, 3)
    )
    def setup(self, num_blocks, num_slots, interval):
        self.pool = SnapshotPool(
            num_blocks, B, num_slots=num_slots, interval_blocks=interval, bytes_per_snapshot=8
        )

    @rule(prompt=prompts)
    def admit(self, prompt):
        """Probe with pending blocks and snapshots counted, lease, escrow blocks and slots, commit."""
        pool, hashes = self.pool, hash_blocks(prompt, B)
        k = min(pool.match(hashes).num_blocks, (len(prompt) - 1) // B)
        k = pool.match_snapshots(hashes, k).num_blocks
        request_id, self.next_id = self.next_id, self.next_id + 1
        lease = pool.lease(request_id, hashes, k)
        if not lease.ok:  # the blocks are escrow victims of committed requests
            assert not pool.has_request(request_id) and "escrow" in lease.reason, lease.reason
            return
        boundaries = snapshot_boundaries(k, len(prompt), B, pool.interval_blocks)
        if (
            not pool.reserve(request_id, -(-len(prompt) // B) - k).ok
            or not pool.reserve_snapshots(request_id, boundaries).ok
            or not pool.commit(request_id, hashes[k:]).ok
        ):
            pool.release(request_id)
            return
        leased = pool.snapshot_plan(request_id).leased
        assert (leased is None) == (k == 0)
        if leased is not None and not leased.computed:
            self.num_pending_leases += 1
        self.requests[request_id] = Model(hashes, len(prompt), k, "committed")

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def advance(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.requests)))
        model = self.requests[request_id]
        pool = self.pool
        if model.phase == "committed":
            try:
                pool.materialize(request_id)
            except PendingBlockError:
                return
            model.phase = "materialized"
            model.num_published = model.num_leased * B
        elif model.num_published < model.num_tokens:
            end = data.draw(st.integers(model.num_published + 1, model.num_tokens))
            plan = pool.snapshot_plan(request_id)
            first = model.num_published == model.num_leased * B
            saves = {
                slot: model.hashes[b - 1]
                for b, slot in plan.save_slots().items()
                if model.num_published < b * B <= end
            }
            try:
                pool.publish(request_id, end)
            except PendingBlockError:  # the state or blocks it starts from are not written
                return
            if first and model.num_leased:
                # the chunk ran: it read the state after its leased prefix from its snapshot's slot
                assert plan.leased.computed
                assert self.slot_content[plan.leased.slot] == model.hashes[model.num_leased - 1], (
                    "resumed from a slot holding another state"
                )
            self.slot_content.update(saves)
            model.num_published = end
        else:
            pool.free(request_id)
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
        for request_id in self.requests:
            leased = self.pool.snapshot_plan(request_id).leased
            if leased is not None and not leased.dead:
                assert leased.block_hash == self.requests[request_id].hashes[leased.num_blocks - 1]

    def teardown(self):
        if not hasattr(self, "pool"):
            return
        for request_id in list(self.requests):
            self.pool.release(request_id)
        self.pool.check_integrity()
        assert self.pool.num_free_slots + self.pool.num_snapshots == self.pool.num_slots
        assert self.pool.num_pending_snapshots == 0
        assert all(s.ref_count == 0 for s in self.pool._snapshots.values())


PendingSnapshotMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_pending_snapshot_machine = PendingSnapshotMachine.TestCase


def test_the_machine_leases_pending_snapshots():
    """The machine above would pass vacuously if no request ever leased a pending snapshot."""
    machine = PendingSnapshotMachine()
    machine.setup(num_blocks=40, num_slots=12, interval=2)
    machine.admit(BASES[0][:16] + [0])
    machine.admit(BASES[0][:16] + [1, 1])
    assert machine.num_pending_leases == 1
    machine.consistent()
    machine.teardown()
