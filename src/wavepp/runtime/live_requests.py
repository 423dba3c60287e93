"""The requests of rank 0 that have not ended: the caller's ids and their futures.

Callers name requests (any int, or an automatic one); the leader and the stages see an
internal id that is never reused, so a caller's id is free again as soon as its request ended,
whatever of it is still being released on the stages.

    caller's id --(ids)--> internal id --(futures)--> (caller's id, Future)

Not thread-safe: the engine core calls it under its lock.
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future


class LiveRequests:
    def __init__(self):
        self._ids: dict[int, int] = {}                       # caller's id -> internal id
        self._futures: dict[int, tuple[int, Future]] = {}    # internal id -> (caller's id, future)
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
            raise ValueError(f"request id {request_id} is already in use by a request that "
                             f"has not finished")
        internal_id = next(self._internal_ids)
        fut: Future = Future()
        fut.request_id = request_id      # for abort(), whichever id it got
        self._ids[request_id] = internal_id
        self._futures[internal_id] = (request_id, fut)
        return internal_id, fut

    def internal_id(self, request_id: int) -> int | None:
        """The internal id of the caller's live request, or None (unknown or ended)."""
        return self._ids.get(request_id)

    def remove(self, internal_id: int) -> tuple[int, Future]:
        """The request ended: (its caller's id, its future); the caller's id is free again."""
        request_id, fut = self._futures.pop(internal_id)
        del self._ids[request_id]
        return request_id, fut

    def remove_all(self) -> list[Future]:
        """Every live request's future; none is live afterwards."""
        out = [fut for _, fut in self._futures.values()]
        self._futures.clear()
        self._ids.clear()
        return out
