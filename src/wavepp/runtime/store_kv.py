"""The bytes of one stage's blocks in the shared KV store: `SharedBlockStore` over a Mooncake
Store client (runtime/mooncake_store.py).

An entry is one block of this stage's layers, every pool of it, behind a header:

    b"WPKV" | xxh3_128(key + payload) (16 bytes) | payload
    payload = for each pool (in the pools' order): block [num_pool_layers, block_size, width]

The checksum covers the key, so bytes stored (or copied) under another key fail it as surely as
bytes changed in place. An entry that fails is never loaded: the fetch is refused, the key is
remembered as bad (`exists` says no from then on, so the next probe computes the block) and
`num_corrupt` counts it.

Puts leave the compute loop at once: `put` copies the blocks out of the pools (they may be
reused as soon as the wave completes) and queues the copy; a writer thread builds the entries
and stores them. A full queue drops the put (counted): the store is a cache, the loop never
waits for it. Fetches run on the thread that answers the round, since the lease needs them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

import torch
import xxhash

from wavepp.models.paged_pools import PagedPools
from wavepp.runtime.mooncake_store import MooncakeStoreClient

logger = logging.getLogger(__name__)

_MAGIC = b"WPKV"
_HEADER = len(_MAGIC) + 16
_MAX_BAD_KEYS = 4096


def _checksum(key: str, payload: bytes | memoryview) -> bytes:
    digest = xxhash.xxh3_128()
    digest.update(key.encode())
    digest.update(payload)
    return digest.digest()


class StoreKVBlocks:
    """This stage's blocks in a shared store; implements `wavepp.cache.SharedBlockStore`."""

    def __init__(
        self, pools: PagedPools, client: MooncakeStoreClient, max_pending_blocks: int = 1024
    ) -> None:
        if pools.states:
            raise ValueError(
                "the shared KV store does not carry recurrent-state snapshots "
                f"({pools.layout.architecture} keeps them)"
            )
        self.pools = pools
        self.client = client
        # name -> (offset in a payload, bytes, shape of one block [layers, block_size, width])
        self._parts: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        offset = 0
        for name, t in pools.tensors.items():
            size = t[:, 0].numel() * t.element_size()
            self._parts[name] = (offset, size, tuple(t[:, 0].shape))
            offset += size
        self.block_bytes = offset
        self._bad: OrderedDict[str, None] = OrderedDict()  # keys whose entry failed its check
        self._lock = threading.Lock()  # guards _bad and the counters
        self.num_corrupt = 0  # entries that failed their checksum (never loaded)
        self.num_missing = 0  # fetches that found a block gone since the probe
        self.num_put_blocks = 0  # blocks the store took
        self.num_dropped_puts = 0  # blocks not stored: the queue was full or the store refused
        self.load_seconds = 0.0  # fetching and checking, all loads
        self._pending: queue.Queue = queue.Queue(maxsize=max(1, max_pending_blocks // 16))
        self._writer = threading.Thread(
            target=self._write_loop, name="kv-store-writer", daemon=True
        )
        self._writer.start()

    # ---- SharedBlockStore -------------------------------------------------------------------

    def exists(self, keys: Sequence[str]) -> list[bool]:
        held = self.client.exists(keys)
        with self._lock:
            return [h and k not in self._bad for k, h in zip(keys, held)]

    def fetch(self, keys: Sequence[str]) -> dict[str, torch.Tensor] | None:
        """name -> [num_blocks, layers, block_size, width] on the host, every entry checked;
        None when one is gone or bad."""
        t0 = time.perf_counter()
        try:
            values = self.client.get(keys, _HEADER + self.block_bytes)
            payloads = []
            for key, value in zip(keys, values):
                if value is None:
                    with self._lock:
                        self.num_missing += 1
                    return None
                if not self._valid(key, value):
                    self._mark_bad(key)
                    return None
                payloads.append(memoryview(value)[_HEADER:])
            rows = torch.frombuffer(bytearray(b"".join(payloads)), dtype=torch.uint8)
            rows = rows.view(len(keys), self.block_bytes)
            dtype = self.pools.dtype
            return {
                name: rows[:, off : off + size].contiguous().view(dtype).view(len(keys), *shape)
                for name, (off, size, shape) in self._parts.items()
            }
        finally:
            with self._lock:
                self.load_seconds += time.perf_counter() - t0

    def load(self, staged: object, block_ids: Sequence[int]) -> None:
        assert isinstance(staged, dict)
        ids = torch.tensor(list(block_ids), dtype=torch.int64, device=self.pools.device)
        for name, tensor in self.pools.tensors.items():
            # [layers, num_blocks, block_size, width] at blocks `ids`
            blocks = staged[name].to(self.pools.device, non_blocking=True).transpose(0, 1)
            tensor.index_copy_(1, ids, blocks)

    def put(self, keys: Sequence[str], block_ids: Sequence[int]) -> None:
        ids = torch.tensor(list(block_ids), dtype=torch.int64, device=self.pools.device)
        # name -> [layers, n, block_size, width], a copy on the host (indexing copies)
        copies = {name: t.index_select(1, ids).cpu() for name, t in self.pools.tensors.items()}
        try:
            self._pending.put_nowait((list(keys), copies))
        except queue.Full:
            with self._lock:
                self.num_dropped_puts += len(keys)

    def clear(self, prefix: str) -> None:
        self._pending.join()  # the puts queued before land first, then go with the rest
        self.client.remove_prefix(prefix)
        with self._lock:
            self._bad.clear()

    # ---- the rest ---------------------------------------------------------------------------

    def close(self, timeout_s: float = 10.0) -> None:
        """Store what is queued (up to `timeout_s`), then stop the writer."""
        self._pending.put(None)
        self._writer.join(timeout_s)

    def counters(self) -> dict[str, float]:
        with self._lock:
            return {
                "corrupt": self.num_corrupt,
                "missing": self.num_missing,
                "put_blocks": self.num_put_blocks,
                "dropped_puts": self.num_dropped_puts,
                "load_seconds": self.load_seconds,
                "reachable": float(self.client.reachable),
            }

    def entry(self, key: str, payload: bytes) -> bytes:
        """The stored form of `payload` under `key`: header, then payload."""
        return _MAGIC + _checksum(key, payload) + payload

    def _valid(self, key: str, value: bytes) -> bool:
        return (
            len(value) == _HEADER + self.block_bytes
            and value[: len(_MAGIC)] == _MAGIC
            and value[len(_MAGIC) : _HEADER] == _checksum(key, memoryview(value)[_HEADER:])
        )

    def _mark_bad(self, key: str) -> None:
        with self._lock:
            self.num_corrupt += 1
            self._bad[key] = None
            if len(self._bad) > _MAX_BAD_KEYS:
                self._bad.popitem(last=False)
        logger.warning("KV store entry %s failed its checksum: not loaded, computed instead", key)

    def _write_loop(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                self._pending.task_done()
                return
            try:
                self._store(*item)
            except Exception:  # a put is a cache fill: count it lost, keep the writer alive
                logger.exception("KV store writer: a put failed")
                with self._lock:
                    self.num_dropped_puts += len(item[0])
            finally:
                self._pending.task_done()

    def _store(self, keys: list[str], copies: dict[str, torch.Tensor]) -> None:
        """Build the entries of one put and store them (the writer thread)."""
        values = []
        for i, key in enumerate(keys):
            payload = b"".join(
                copies[name][:, i].contiguous().view(torch.uint8).numpy().tobytes()
                for name in self._parts
            )
            values.append(self.entry(key, payload))
        ok = self.client.put(keys, values)
        with self._lock:
            if ok:
                self.num_put_blocks += len(keys)
            else:
                self.num_dropped_puts += len(keys)
