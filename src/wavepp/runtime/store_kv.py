"""The bytes of one stage's blocks in the shared KV store: `SharedBlockStore` over a Mooncake
Store client (runtime/mooncake_store.py).

An entry is one block of this stage's layers, every pool of it, or (hybrid models) the
recurrent state after one, every state pool of it, behind a header:

    b"WPKV" | xxh3_128(key + payload) (16 bytes) | payload
    payload = for each pool (in the pools' order): block [num_pool_layers, block_size, width]
              (a state: for each state pool, [num_state_layers, elements])

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
        self.pools = pools
        self.client = client
        self._blocks = _EntryLayout(pools.tensors, 1)  # [layers, blocks, block_size, width]
        self._state_entries = _EntryLayout(pools.states, 0)  # [slots, layers, elements]
        self.block_bytes = max(1, self._blocks.num_bytes)
        self._bad: OrderedDict[str, None] = OrderedDict()  # keys whose entry failed its check
        self._lock = threading.Lock()  # guards _bad and the counters
        self.num_corrupt = 0  # entries that failed their checksum (never loaded)
        self.num_missing = 0  # fetches that found a block gone since the probe
        self.num_put_blocks = 0  # blocks the store took
        self.num_put_states = 0  # states the store took (hybrid models)
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
        return self._fetch(keys, self._blocks)

    def fetch_states(self, keys: Sequence[str]) -> dict[str, torch.Tensor] | None:
        """name -> [num_states, layers, elements] on the host, as `fetch`."""
        return self._fetch(keys, self._state_entries)

    def load_states(self, staged: object, slots: Sequence[int]) -> None:
        assert isinstance(staged, dict)
        self.pools.write_states(staged, slots)

    def stage_blocks(self, block_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        return self.pools.copy_blocks(block_ids)

    def load(self, staged: object, block_ids: Sequence[int]) -> None:
        assert isinstance(staged, dict)
        self.pools.write_blocks(staged, block_ids)

    def put(self, keys: Sequence[str], block_ids: Sequence[int]) -> None:
        self._put(keys, block_ids, self._blocks)

    def put_states(self, keys: Sequence[str], slots: Sequence[int]) -> None:
        self._put(keys, slots, self._state_entries)

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
                "put_states": self.num_put_states,
                "dropped_puts": self.num_dropped_puts,
                "load_seconds": self.load_seconds,
                "reachable": float(self.client.reachable),
            }

    def entry(self, key: str, payload: bytes) -> bytes:
        """The stored form of `payload` under `key`: header, then payload."""
        return _MAGIC + _checksum(key, payload) + payload

    def _valid(self, key: str, value: bytes, payload_bytes: int) -> bool:
        return (
            len(value) == _HEADER + payload_bytes
            and value[: len(_MAGIC)] == _MAGIC
            and value[len(_MAGIC) : _HEADER] == _checksum(key, memoryview(value)[_HEADER:])
        )

    def _fetch(self, keys: Sequence[str], layout: "_EntryLayout") -> dict[str, torch.Tensor] | None:
        """name -> [len(keys), *one entry's shape] of `layout`, every entry checked; None when
        one is gone or bad."""
        t0 = time.perf_counter()
        try:
            # each key once: a batch that names a key twice reads it back as zeros (a load may
            # want one state twice: a boundary's slot and the working slot it resumes from)
            unique = list(dict.fromkeys(keys))
            got = dict(zip(unique, self.client.get(unique, _HEADER + layout.num_bytes)))
            values = [got[key] for key in keys]
            payloads = []
            for key, value in zip(keys, values):
                if value is None:
                    with self._lock:
                        self.num_missing += 1
                    return None
                if not self._valid(key, value, layout.num_bytes):
                    self._mark_bad(key)
                    return None
                payloads.append(memoryview(value)[_HEADER:])
            return layout.unpack(b"".join(payloads), len(keys))
        finally:
            with self._lock:
                self.load_seconds += time.perf_counter() - t0

    def _put(self, keys: Sequence[str], indices: Sequence[int], layout: "_EntryLayout") -> None:
        """Copy the entries at `indices` of `layout`'s tensors now and queue them (a stage with
        no tensors of that kind stores entries of no bytes: what is held is still worth
        knowing)."""
        unique: dict[str, int] = {}  # each key once: a batch naming one twice stores zeros
        for key, index in zip(keys, indices):
            unique.setdefault(key, index)
        keys, indices = list(unique), list(unique.values())
        ids = torch.tensor(list(indices), dtype=torch.int64, device=self.pools.device)
        # name -> the entries, a copy on the host (indexing copies)
        copies = {name: t.index_select(layout.dim, ids).cpu() for name, t in layout.tensors.items()}
        try:
            self._pending.put_nowait((list(keys), copies, layout))
        except queue.Full:
            with self._lock:
                self.num_dropped_puts += len(keys)

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

    def _store(self, keys: list[str], copies: dict[str, torch.Tensor], layout) -> None:
        """Build the entries of one put and store them (the writer thread)."""
        values = [self.entry(key, layout.pack(copies, i)) for i, key in enumerate(keys)]
        ok = self.client.put(keys, values)
        with self._lock:
            if ok and layout is self._blocks:
                self.num_put_blocks += len(keys)
            elif ok:
                self.num_put_states += len(keys)
            else:
                self.num_dropped_puts += len(keys)


class _EntryLayout:
    """How one kind of entry (a block of every KV pool, or a state of every state pool) is laid
    out in a payload: each tensor's part in order, indexed along `dim` in the stage's tensors."""

    def __init__(self, tensors: dict[str, torch.Tensor], dim: int) -> None:
        self.tensors, self.dim = tensors, dim
        self.parts: dict[str, tuple[int, int, tuple[int, ...]]] = {}  # offset, bytes, shape
        offset = 0
        for name, t in tensors.items():
            one = t.select(dim, 0)
            self.parts[name] = (offset, one.numel() * t.element_size(), tuple(one.shape))
            offset += one.numel() * t.element_size()
        self.num_bytes = offset

    def pack(self, copies: dict[str, torch.Tensor], i: int) -> bytes:
        return b"".join(
            copies[name].select(self.dim, i).contiguous().view(torch.uint8).numpy().tobytes()
            for name in self.parts
        )

    def unpack(self, payloads: bytes, n: int) -> dict[str, torch.Tensor]:
        if not self.num_bytes:
            return {}
        rows = torch.frombuffer(bytearray(payloads), dtype=torch.uint8).view(n, self.num_bytes)
        return {
            name: rows[:, off : off + size]
            .contiguous()
            .view(self.tensors[name].dtype)
            .view(n, *shape)
            for name, (off, size, shape) in self.parts.items()
        }
