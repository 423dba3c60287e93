"""Misuse raises a typed CacheError with a clear message; shortages do not raise."""

import pytest

from wavepp.cache import (
    AlreadyReleasedError,
    BlockPool,
    CacheError,
    IntegrityError,
    InvalidArgumentError,
    PendingBlockError,
    RequestStateError,
    UnknownRequestError,
    hash_blocks,
)

B = 4
HASHES = hash_blocks(list(range(16)), B)


@pytest.fixture
def pool() -> BlockPool:
    return BlockPool(8, B)


def test_every_error_is_a_cache_error():
    for error in (
        AlreadyReleasedError,
        UnknownRequestError,
        RequestStateError,
        InvalidArgumentError,
        PendingBlockError,
        IntegrityError,
    ):
        assert issubclass(error, CacheError)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(num_blocks=0, block_size=4), "num_blocks"),
        (dict(num_blocks=8, block_size=0), "block_size"),
        (dict(num_blocks=8, block_size=4, max_leased_blocks=-1), "max_leased_blocks"),
    ],
)
def test_constructor_names_the_bad_field(kwargs, field):
    with pytest.raises(InvalidArgumentError, match=field):
        BlockPool(**kwargs)


@pytest.mark.parametrize(
    "call",
    [
        "commit",
        "cancel",
        "materialize",
        "publish",
        "free",
        "release",
        "request_state",
        "block_table",
    ],
)
def test_unknown_request(pool, call):
    args = {"commit": ([],), "publish": (4,)}.get(call, ())
    with pytest.raises(UnknownRequestError, match=f"{call}: unknown request 'ghost'"):
        getattr(pool, call)("ghost", *args)


def test_releasing_twice(pool):
    pool.reserve("a", 1)
    pool.release("a")
    with pytest.raises(AlreadyReleasedError, match="release: request 'a' was already released"):
        pool.release("a")
    with pytest.raises(UnknownRequestError):  # also an UnknownRequestError
        pool.free("a")


def test_a_released_id_may_start_over(pool):
    pool.reserve("a", 1)
    pool.release("a")
    assert pool.lease("a", HASHES, 0).ok
    pool.release("a")


def test_leasing_twice_or_after_reserve(pool):
    pool.lease("a", HASHES, 0)
    with pytest.raises(
        RequestStateError, match="lease: request 'a' is leased: a request leases once"
    ):
        pool.lease("a", HASHES, 0)
    pool.reserve("b", 1)
    with pytest.raises(RequestStateError, match="'b' is reserved"):
        pool.lease("b", HASHES, 0)


def test_commit_without_reservation_or_twice(pool):
    pool.lease("a", HASHES, 0)
    with pytest.raises(RequestStateError, match="commit needs a reservation"):
        pool.commit("a", [])
    pool.reserve("a", 1)
    pool.commit("a", [])
    with pytest.raises(RequestStateError, match="'a' is committed"):
        pool.commit("a", [])


def test_commit_with_more_hashes_than_blocks(pool):
    pool.reserve("a", 2)
    with pytest.raises(InvalidArgumentError, match="4 new hashes for 2 reserved"):
        pool.commit("a", HASHES)


def test_reserve_twice_or_negative(pool):
    pool.reserve("a", 1)
    with pytest.raises(RequestStateError, match="already holds"):
        pool.reserve("a", 1)
    with pytest.raises(InvalidArgumentError):
        pool.reserve("b", -1)


def test_lease_more_than_the_hashes(pool):
    with pytest.raises(InvalidArgumentError, match=r"num_blocks=5 not in \[0, 4\]"):
        pool.lease("a", HASHES, 5)


def test_materialize_an_uncommitted_escrow(pool):
    pool.reserve("a", 1)
    with pytest.raises(RequestStateError, match="materialize: request 'a' is reserved"):
        pool.materialize("a")
    pool.commit("a", [])
    pool.materialize("a")
    with pytest.raises(RequestStateError, match="is materialized"):
        pool.materialize("a")


def test_cancel_without_escrow(pool):
    pool.lease("a", HASHES, 0)
    with pytest.raises(RequestStateError, match="nothing reserved"):
        pool.cancel("a")


def test_publish_before_materialize_or_beyond_the_request(pool):
    pool.reserve("a", 2)
    pool.commit("a", HASHES[:2])
    with pytest.raises(RequestStateError, match="publish needs materialized blocks"):
        pool.publish("a", 4)
    pool.materialize("a")
    with pytest.raises(InvalidArgumentError, match="has 8 tokens of blocks, got 9"):
        pool.publish("a", 9)
    with pytest.raises(InvalidArgumentError):
        pool.publish("a", -1)


def test_free_before_materialize(pool):
    pool.reserve("a", 1)
    with pytest.raises(RequestStateError, match="use release"):
        pool.free("a")


def test_shortages_are_results_not_errors(pool):
    assert not pool.lease("a", HASHES, 2).ok  # nothing cached
    assert not pool.reserve("b", 9).ok
    assert not pool.has_request("a") and not pool.has_request("b")


def test_integrity_error_names_the_broken_invariant(pool):
    pool.reserve("a", 2)
    pool.commit("a", HASHES[:2])
    pool.materialize("a")
    pool._index[HASHES[0]].ref_count += 1  # corrupt on purpose
    with pytest.raises(IntegrityError, match="ref_count 2 != 1 holders"):
        pool.check_integrity()
