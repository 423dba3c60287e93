"""Typed errors of the block pool.

Misuse (a call the leader should never make) raises one of these; every one is a
`CacheError`. Expected shortages (no room, a prefix evicted meanwhile, the lease cap) are
not errors: they come back as result records with `ok=False` and a reason.
"""

from __future__ import annotations

from collections.abc import Hashable


class CacheError(Exception):
    """Base class of every error raised by `wavepp.cache`."""


class UnknownRequestError(CacheError, KeyError):
    """The pool holds nothing for this request id."""

    def __init__(self, request_id: Hashable, operation: str) -> None:
        self.request_id = request_id
        self.operation = operation
        super().__init__(f"{operation}: unknown request {request_id!r}")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class AlreadyReleasedError(UnknownRequestError):
    """The request was released (or freed) already; releasing twice is a bug."""

    def __init__(self, request_id: Hashable, operation: str) -> None:
        super().__init__(request_id, operation)
        self.args = (f"{operation}: request {request_id!r} was already released",)


class RequestStateError(CacheError):
    """The operation does not fit the request's current state (e.g. commit before reserve)."""

    def __init__(self, request_id: Hashable, operation: str, state: str, detail: str) -> None:
        self.request_id = request_id
        self.operation = operation
        self.state = state
        super().__init__(f"{operation}: request {request_id!r} is {state}: {detail}")


class InvalidArgumentError(CacheError, ValueError):
    """A count or length out of range (negative blocks, publishing beyond the request's length...)."""


class PendingBlockError(CacheError):
    """A request needs a block another request has not materialized or not computed yet.

    The leader orders chunks so that this cannot happen; when it does, the pool refuses loudly
    rather than hand out a block table that points at KV nobody wrote.
    """

    def __init__(
        self, request_id: Hashable, owner_id: Hashable, operation: str, detail: str
    ) -> None:
        self.request_id = request_id
        self.owner_id = owner_id
        super().__init__(
            f"{operation}: request {request_id!r} depends on a block of request {owner_id!r} "
            f"that {detail}"
        )


class IntegrityError(CacheError, AssertionError):
    """`BlockPool.check_integrity()` found a broken invariant; the message names it."""
