"""The requests of rank 0 that have not ended: the caller's ids and their futures.

Callers name requests (any int, or an automatic one); the leader and the stages see an
internal id that is never reused, so a caller's id is free again as soon as its request ended,
whatever of it is still being released on the stages.

    caller's id --(ids)--> internal id --(futures)--> (caller's id, Future)

Not thread-safe: the engine core calls it under its lock. (A hand-off's stage reports and its
deadline are the KV hand-off's: kv_transfer/handoff.py.)
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from typing import Callable


class LiveRequests:
    def __init__(self):
        self._ids: dict[int, int] = {}  # caller's id -> internal id
        self._futures: dict[int, tuple[int, Future]] = {}  # internal id -> (caller's id, future)
        self._internal_ids = itertools.count()
        self._auto_ids = itertools.count()

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, request_id: int | None) -> tuple[int, Future]:
        """A new live request under the caller's id (None: the next automatic id not in use):
        its internal id and its future, whose `request_id` attribute is the caller's id. An id
        in use by a live request raises ValueError and adds nothing."""
        if request_id is None:
            request_id = next(i for i in self._auto_ids if i not in self._ids)
        elif request_id in self._ids:
            raise ValueError(
                f"request id {request_id} is already in use by a request that has not finished"
            )
        internal_id = next(self._internal_ids)
        fut: Future = Future()
        fut.request_id = request_id  # for abort(), whichever id it got
        self._ids[request_id] = internal_id
        self._futures[internal_id] = (request_id, fut)
        return internal_id, fut

    def internal_id(self, request_id: int) -> int | None:
        """The internal id of the caller's live request, or None (unknown or ended)."""
        return self._ids.get(request_id)

    def pop(self, internal_id: int) -> tuple[int, Future] | None:
        """The request ended: (its caller's id, its future), or None if it is not live (ended
        already); the caller's id is free again."""
        entry = self._futures.pop(internal_id, None)
        if entry is not None:
            del self._ids[entry[0]]
        return entry

    def resolve(self, internal_id: int, value: Callable[[int], object]) -> None:
        """The request ended: its future gets value(caller's id), or the exception that raises
        (the caller hears of it instead of waiting for ever). Nothing for one not live."""
        entry = self.pop(internal_id)
        if entry is None or entry[1].done():
            return
        request_id, fut = entry
        try:
            fut.set_result(value(request_id))
        except Exception as exc:
            fut.set_exception(exc)

    def fail_all(self, exc: BaseException) -> None:
        """Every live request's future fails with `exc`; none is live afterwards."""
        futures = [fut for _, fut in self._futures.values()]
        self._futures.clear()
        self._ids.clear()
        for fut in futures:
            if not fut.done():
                fut.set_exception(exc)
