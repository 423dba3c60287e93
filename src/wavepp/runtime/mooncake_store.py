"""A stage's connection to Mooncake Store, the KV tier every replica shares (`--kv-tier
mooncake-store`): keys to bytes, and nothing fails when the store cannot be reached.

    mooncake_master -rpc_port 50051 -enable_http_metadata_server=true \\
        -http_metadata_server_port 8080          # once, on any host
    wavepp serve ... --kv-tier mooncake-store --kv-tier-master HOST:50051

Each stage process is a client of its own: it lends `segment_bytes` of its memory to the store
(entries live in the clients' segments, wherever the master places them) and reads through a
`buffer_bytes` transfer buffer. A call that fails (the master down, killed, unreachable) costs
one error: the client answers "not held" to every call for `retry_s`, then tries again, so a
dead store costs only its hits and at most one slow call per `retry_s`. The Mooncake client
finds a restarted master itself; a client whose setup failed is set up again on the next try.

A master that does not answer at all (its host's link cut) would hold a call for Mooncake's RPC
timeout (30 s), and the lookups run on the stage's round thread, which every request waits on.
So the lookups (`exists`, `get`) and the set-up again run on a thread of the client's own and
are waited for `timeout_s` (`--kv-tier-timeout-s`) at most: past it the store counts as down
(hits off for `retry_s`), and while that call is still stuck every lookup answers "not held"
at once. The RPC timeout is set to twice `timeout_s`, so a stuck call ends one wait after it
was given up, and the wait, not the RPC's own error, always ends first (one counted timeout:
with both at `timeout_s` the two raced, and a loaded machine counted an RPC error instead).
Puts run on the stage's store writer thread, which nothing waits on.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from wavepp.env import set_store_rpc_timeout

logger = logging.getLogger(__name__)

# Mooncake Store's error codes -999..-900 are its RPCs' (the master unreachable, killed); the
# others refuse one call with the store up (-200: no room for a put until it evicts).
_RPC_ERRORS = range(-999, -899)


class MooncakeStoreClient:
    """Keys to bytes in Mooncake Store; see the module docstring. Thread-safe: the stage's
    round thread (exists, get) and its store writer (put) share it."""

    def __init__(
        self,
        master: str,
        metadata: str | None = None,
        local_host: str = "127.0.0.1",
        segment_bytes: int = 1 << 30,
        buffer_bytes: int = 64 << 20,
        retry_s: float = 2.0,
        timeout_s: float = 5.0,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"the store's timeout must be positive, got {timeout_s} s")
        self.master = master
        # the master's own HTTP metadata server, on its usual port, unless named
        self.metadata = metadata or f"http://{master.rsplit(':', 1)[0]}:8080/metadata"
        self.local_host = local_host
        self.segment_bytes = segment_bytes
        self.buffer_bytes = buffer_bytes
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        # read by the client at set-up: a stuck call ends a wait after it is given up
        set_store_rpc_timeout(2 * timeout_s)
        self._lock = threading.Lock()  # guards the fields below, never held across a call
        self._store = None  # a MooncakeDistributedStore once set up
        self._down_until = 0.0  # no call before this time (monotonic)
        self.num_errors = 0  # calls that failed (the store unreachable or refusing)
        self._reached = False  # whether the last call reached the store
        self.num_timeouts = 0  # lookups given up after timeout_s
        self._caller = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mooncake-store")
        self._pending: Future | None = None  # the lookup the caller thread runs
        self._connect()

    @property
    def reachable(self) -> bool:
        """Whether the last call reached the store (while the store is counted down, and after
        it, until a call reaches it again)."""
        return self._store is not None and self._reached

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is held; all False when the store cannot be reached."""
        if not keys:
            return []
        store = self._ready()
        codes = self._bounded("batch_is_exist", store.batch_is_exist, list(keys)) if store else None
        if codes is None:
            return [False] * len(keys)
        if any(code in _RPC_ERRORS for code in codes):
            self._failed("batch_is_exist", min(codes))
            return [False] * len(keys)
        return [code == 1 for code in codes]

    def get(self, keys: Sequence[str], value_bytes: int) -> list[bytes | None]:
        """Each key's bytes (None: not held, or the store cannot be reached), fetched in
        batches whose values (about `value_bytes` each) fit half the transfer buffer."""
        store = self._ready()
        if store is None:
            return [None] * len(keys)
        per_batch = max(1, self.buffer_bytes // (2 * max(1, value_bytes)))
        values: list[bytes | None] = []
        for i in range(0, len(keys), per_batch):
            batch = self._bounded("get_batch", store.get_batch, list(keys[i : i + per_batch]))
            if batch is None:
                return [None] * len(keys)
            values.extend(v if v else None for v in batch)
        return values

    def put(self, keys: Sequence[str], values: Sequence[bytes]) -> bool:
        """Store `values` under `keys` (a key held already keeps its bytes); False when the
        store refused or could not be reached (the entries are then not there)."""
        store = self._ready()
        if store is None:
            return False
        per_batch = max(1, self.buffer_bytes // (2 * max(1, len(values[0])))) if values else 1
        for i in range(0, len(keys), per_batch):
            code = store.put_batch(list(keys[i : i + per_batch]), list(values[i : i + per_batch]))
            if code in _RPC_ERRORS:
                self._failed("put_batch", code)
            else:
                self._reached = True  # answered, a refusal included
            if code != 0:
                return False
        return True

    def remove_prefix(self, prefix: str) -> None:
        """Remove every entry whose key starts with `prefix`, leased ones too (a read leases
        an entry for a while)."""
        store = self._ready()
        if store is not None:
            store.remove_by_regex("^" + re.escape(prefix), True)

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
        self._caller.shutdown(wait=False, cancel_futures=True)
        if store is not None:
            store.close()

    # ---- private helpers --------------------------------------------------------------------

    def _bounded(self, call: str, fn: Callable, *args):
        """`fn(*args)` on the caller thread, waited for `timeout_s`; None when it did not end
        in time (the store then counts as down) or an earlier call is still stuck there."""
        with self._lock:
            if self._pending is not None and not self._pending.done():
                return None
            if time.monotonic() < self._down_until:
                return None
            future = self._pending = self._caller.submit(fn, *args)
        try:
            result = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            with self._lock:
                self.num_timeouts += 1
            self._failed(f"{call} (no answer within {self.timeout_s:g} s)", -1)
            return None
        if result is not None:  # it answered (an error code in the answer calls _failed after;
            self._reached = True  # a set-up that failed returns None, having called it)
        return result

    def _ready(self):
        """The store client, or None while the store is counted down; set up again (on the
        caller thread, bounded) where the last set-up failed."""
        with self._lock:
            if time.monotonic() < self._down_until:
                return None
            store = self._store
        return store if store is not None else self._bounded("setup", self._connect)

    def _connect(self):
        from mooncake.store import MooncakeDistributedStore

        store = MooncakeDistributedStore()
        code = store.setup(
            self.local_host,
            self.metadata,
            self.segment_bytes,
            self.buffer_bytes,
            "tcp",
            "",
            self.master,
        )
        if code != 0:
            self._failed("setup", code)
            return None
        with self._lock:
            self._store = store
            self._reached = True
        return store

    def _failed(self, call: str, code: int) -> None:
        with self._lock:
            first = time.monotonic() >= self._down_until
            self._down_until = time.monotonic() + self.retry_s
            self.num_errors += 1
            self._reached = False
        if first:
            logger.warning(
                "Mooncake Store at %s: %s failed (%d); its hits are off for %.1f s",
                self.master,
                call,
                code,
                self.retry_s,
            )
