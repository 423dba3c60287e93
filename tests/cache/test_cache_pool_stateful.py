"""Random interleavings of a leader's calls against one BlockPool, checked after every step.

Prompts grow from a few shared prefixes so matches, in-flight sharing, dedup and claims all
happen. Besides check_integrity(), the machine keeps its own model of what each physical block
holds (written at materialize) and asserts that no block a live request reads is ever handed
to another request.
"""

from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from wavepp.cache import BlockPool, PendingBlockError, hash_blocks

B = 2
BASES = (list(range(100, 112)), list(range(200, 212)), [7] * 12)

prompts = st.builds(
    lambda base, length, suffix: BASES[base][:length] + suffix,
    st.sampled_from(range(len(BASES))),
    st.sampled_from([12, 8, 4, 10, 6, 2, 0]),
    st.lists(st.integers(0, 1), max_size=5),
).filter(bool)


@dataclass
class Model:
    """What the leader knows of one request on this stage."""

    tokens: list[int]
    hashes: list[int]
    num_leased: int
    phase: str  # leased | reserved | committed | materialized
    table: list[int] | None = None
    num_published: int = 0

    @property
    def num_new(self) -> int:
        return -(-len(self.tokens) // B) - self.num_leased


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[int, Model] = {}
        self.next_id = 0
        self.content: dict[int, object] = {}  # block id -> what its owner's materialize wrote
        self.last_probe: tuple[list[int], int] | None = None

    @initialize(num_blocks=st.integers(3, 32), cap=st.one_of(st.none(), st.integers(0, 16)))
    def setup(self, num_blocks, cap):
        self.pool = BlockPool(num_blocks, B, max_leased_blocks=cap)

    def _ids(self, *phases: str) -> list[int]:
        return sorted(i for i, m in self.requests.items() if m.phase in phases)

    def _pick(self, data, *phases: str) -> int:
        return data.draw(st.sampled_from(self._ids(*phases)))

    @rule(prompt=prompts, data=st.data())
    def lease(self, prompt, data):
        hashes = hash_blocks(prompt, B)
        found = self.pool.match(hashes)
        assert found.num_blocks == self.pool.match_linear(hashes)
        num_leased = found.num_blocks  # what the leader leases when every stage agrees; else less
        if data.draw(st.booleans()):
            num_leased = data.draw(st.integers(0, found.num_blocks))
        request_id, self.next_id = self.next_id, self.next_id + 1
        if self.pool.lease(request_id, hashes, num_leased).ok:
            self.requests[request_id] = Model(prompt, hashes, num_leased, "leased")

    @rule(prompt=prompts, data=st.data())
    def serve(self, prompt, data):
        """A new request taken as far as it goes in one step (often all the way: cached)."""
        self.lease(prompt, data)
        request_id = self.next_id - 1
        for _ in range(6):
            if request_id not in self.requests:
                return
            model = self.requests[request_id]
            phase, num_published = model.phase, model.num_published
            self._advance(data, request_id, publish_all=True)
            if request_id in self.requests and (model.phase, model.num_published) == (
                phase,
                num_published,
            ):
                return  # stuck: no room, or waiting on another request

    @rule(prompt=prompts)
    def reserve_without_lease(self, prompt):
        model = Model(prompt, hash_blocks(prompt, B), 0, "reserved")
        request_id, self.next_id = self.next_id, self.next_id + 1
        if self.pool.reserve(request_id, model.num_new).ok:
            self.requests[request_id] = model

    # Three copies of one rule: rules are drawn uniformly, and requests should often get far.
    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def advance(self, data):
        self._advance(data)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def advance_again(self, data):
        self._advance(data)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def advance_once_more(self, data):
        self._advance(data)

    @precondition(lambda self: self._ids("reserved", "committed"))
    @rule(data=st.data())
    def cancel(self, data):
        request_id = self._pick(data, "reserved", "committed")
        self.pool.cancel(request_id)
        self.requests[request_id].phase = "leased"

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def release(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.requests)))
        self.pool.release(request_id)
        del self.requests[request_id]

    def _advance(self, data, request_id: int | None = None, publish_all: bool = False) -> None:
        """The next call the leader makes for one request, whatever its phase."""
        if request_id is None:
            request_id = data.draw(st.sampled_from(sorted(self.requests)))
        model = self.requests[request_id]
        if model.phase == "leased":
            result = self.pool.reserve(request_id, model.num_new)
            if result.ok:
                assert len(result.victims) == model.num_new
                model.phase = "reserved"
        elif model.phase == "reserved":
            result = self.pool.commit(request_id, model.hashes[model.num_leased :])
            model.phase = "committed" if result.ok else "leased"
        elif model.phase == "committed":
            self._materialize(request_id, model)
        elif model.num_published < len(model.tokens):
            num_tokens = len(model.tokens)
            if not publish_all:
                num_tokens = data.draw(st.integers(model.num_published, len(model.tokens)))
            try:
                self.pool.publish(request_id, num_tokens)
            except PendingBlockError:
                return  # its leased prefix is not computed yet: the leader would not run it
            model.num_published = num_tokens
        else:
            self.pool.free(request_id)
            del self.requests[request_id]

    def _materialize(self, request_id: int, model: Model) -> None:
        try:
            table = self.pool.materialize(request_id)
        except PendingBlockError:
            return  # an owner upstream has not materialized: the leader would wait
        assert len(table) == len(set(table)) == model.num_leased + model.num_new
        for i, block_id in enumerate(table[: model.num_leased]):
            assert self.content.get(block_id) == model.hashes[i], "leased block holds other KV"
        for i in range(model.num_leased, len(table)):
            self.content[table[i]] = self._expected(model, request_id, i)
        model.table, model.phase = table, "materialized"

    @rule(prompt=prompts)
    def probe(self, prompt):
        hashes = hash_blocks(prompt, B)
        found = self.pool.match(hashes)
        assert found.num_blocks == self.pool.match_linear(hashes)
        assert found.num_computed_blocks <= found.num_blocks
        self.last_probe = (prompt, found.num_blocks)

    @precondition(lambda self: self.last_probe is not None)
    @rule()
    def lease_after_a_stale_probe(self):
        """Other calls ran since the probe: its blocks may be gone; then the lease says so."""
        prompt, num_leased = self.last_probe
        hashes = hash_blocks(prompt, B)
        present = self.pool.match(hashes).num_blocks
        request_id, self.next_id = self.next_id, self.next_id + 1
        result = self.pool.lease(request_id, hashes, num_leased)
        assert (
            result.ok or present < num_leased or "cap" in result.reason or "escrow" in result.reason
        )
        if result.ok:
            self.requests[request_id] = Model(prompt, hashes, num_leased, "leased")

    @invariant()
    def pool_is_consistent(self):
        if not hasattr(self, "pool"):
            return
        self.pool.check_integrity()
        for request_id, model in self.requests.items():
            if model.table is not None:
                for i, block_id in enumerate(model.table):
                    expected = self._expected(model, request_id, i)  # leased: the hash, too
                    assert self.content[block_id] == expected, (
                        f"block {block_id} of {request_id} reused"
                    )

    def teardown(self):
        if not hasattr(self, "pool"):
            return
        for request_id in list(self.requests):
            self.pool.release(request_id)
        self.pool.check_integrity()
        cap = self.pool.capacity()
        assert (cap.num_leased, cap.num_escrowed, cap.num_pending, cap.num_in_use) == (0, 0, 0, 0)
        assert cap.num_free + cap.num_evictable == cap.num_blocks
        assert all(e.computed and e.ref_count == 0 for e in self.pool._index.values())

    @staticmethod
    def _expected(model: Model, request_id: int, i: int) -> object:
        return model.hashes[i] if i < len(model.hashes) else ("partial", request_id)


PoolMachine.TestCase.settings = settings(
    max_examples=500,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_pool_machine = PoolMachine.TestCase
