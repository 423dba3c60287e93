"""One stage's compute: its model slice, its paged KV tensors, its BlockPool and StageServer
(and with host_kv_gib, the pool's host tier over a HostKVStore of those tensors).

    run(wave, tokens | hidden) -> hidden (or, on the last stage, TokenResults)

prepare (materialize blocks, check the plan) and complete (publish, free) happen under the
stage lock, since the WAVE thread may be answering a round on the same pool meanwhile; the
forward itself runs outside the lock.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import cast

import torch

from wavepp.cache import BlockChanges, HostTier
from wavepp.cache.block_log import attach_block_log
from wavepp.cache.store_tier import StoreTier
from wavepp.kv_transfer.export import StageExporter
from wavepp.kv_transfer.mooncake.engine import local_host_for
from wavepp.kv_transfer.transports import get_transport
from wavepp.models import load_model_config, page_layout, stage_specs
from wavepp.models.batch import ChunkSpec, StageBatch
from wavepp.models.kernels import StageKernels, choose_kernels
from wavepp.models.loader import checkpoint_fingerprint, load_stage_model
from wavepp.models.stage_pool import stage_pool
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.device import TORCH_DTYPES, synchronize
from wavepp.runtime.host_kv import HostKVStore
from wavepp.runtime.mooncake_store import MooncakeStoreClient
from wavepp.runtime.protocol import IntegrityReport
from wavepp.runtime.stage_blocks import stage_blocks
from wavepp.runtime.store_kv import StoreKVBlocks
from wavepp.sched import PromptLogprobs, StageServer, TokenResult, Wave
from wavepp.sched.messages import ProbeMsg
from wavepp.sched.policy import get_policy

# a pool's record of block changes between two cache queries: 4 x its blocks, at least this;
# past it the next query carries the pool's whole set instead (cache/block_log.py)
MIN_BLOCK_LOG_CHANGES = 4096


def _output_rows(wave: Wave):
    """None when every chunk needs only its last token's logits; else (flat row indices of
    every position whose logits are needed, per chunk the list of its own rows): the positions
    [logprob_start, end) of a chunk that asks for prompt logprobs, the last token of the others."""
    if all(c.logprob_start is None for c in wave.chunks):
        return None
    flat, per_chunk, offset = [], [], 0
    for c in wave.chunks:
        # [start, end) of chunk c is the flat rows [offset, offset + num_tokens)
        first = c.logprob_start if c.logprob_start is not None else c.end - 1
        own = list(range(offset + first - c.start, offset + c.num_tokens))
        flat += own
        per_chunk.append(own)
        offset += c.num_tokens
    return torch.tensor(flat, dtype=torch.int64), per_chunk


def rows_kwarg(rows) -> dict:
    return {} if rows is None else {"output_indices": rows[0]}


CPU = torch.device("cpu")


class StageRuntime:
    def __init__(self, config: RuntimeConfig, stage_id: int, device: torch.device = CPU):
        """Load this stage's slice onto `device` (its weights, KV cache and every index tensor
        of its waves live there; inputs arrive on the host or the data plane's device and are
        moved there)."""
        self.config = config
        self.stage_id = stage_id
        self.device = torch.device(device)
        self.model_config = load_model_config(config.model_path)
        self.spec = stage_specs(self.model_config.num_layers, config.engine.pp, config.layer_split)[
            stage_id
        ]
        self.model = load_stage_model(
            config.model_path, self.spec, TORCH_DTYPES[config.engine.dtype]
        ).to(self.device)
        # the kernel paths, measured on this model's shapes (CPUs differ) by the process's first
        # stage, passed to every forward of this stage
        self.kernel_choice: StageKernels = choose_kernels(
            self.model, self.model_config, TORCH_DTYPES[config.engine.dtype], self.device
        )
        sizes = config.stage_blocks or stage_blocks(
            config.engine, self.model_config, config.layer_split
        )
        self.num_blocks = sizes[stage_id]
        self.layout = page_layout(self.model_config)
        self.pool_args = (
            self.layout,
            self.model_config.num_layers,
            self.spec,
            self.num_blocks,
            config.engine.block_size,
            TORCH_DTYPES[config.engine.dtype].itemsize,
            config.engine.snapshot_interval_blocks,
        )
        self.kv = None
        self.host_kv: HostKVStore | None = None  # the host tier's bytes (host_kv_gib > 0)
        self.store_client = self._store_client()  # the shared KV store (kv_tier), or None
        self.store_kv: StoreKVBlocks | None = None  # this stage's blocks in it
        self.store_namespace: str | None = None  # their keys' prefix (_store_tier)
        self.lock = threading.Lock()
        self.reset(config.engine.policy)
        # KV hand-off: this stage writes its own layers of each request that asks for it
        self.exporter = None
        if config.engine.handoff_transport:
            manifest = {
                "model_type": self.model_config.model_type,
                "dtype": config.engine.dtype,
                "block_size": config.engine.block_size,
                "num_stages": config.engine.pp,
                "layers": [self.spec.start_layer, self.spec.end_layer],
            }
            writer = get_transport(config.engine.handoff_transport).stage_writer(config, stage_id)
            self.exporter = StageExporter(writer, stage_id, manifest)

    def close(self) -> None:
        """Finish the exports and the store puts queued (the stage is stopping)."""
        if self.exporter is not None:
            self.exporter.close()
        if self.store_kv is not None:
            self.store_kv.close()
        if self.store_client is not None:
            self.store_client.close()

    def kernels(self) -> str:
        """The kernel paths this stage runs, e.g. "linear=packed attention=chunked_cpp
        elementwise=cpp" (attention: GQA models only; mla, moe: models with such layers;
        elementwise: bf16 on the CPU only)."""
        paths = self.kernel_choice.kernels
        parts = [f"linear={paths.linear}"]
        if self.kernel_choice.attention is not None:
            parts.append(f"attention={paths.attention}")
        layers = self.model_config.layers
        if any(layer.attention.kind == "mla" for layer in layers):
            parts.append(f"mla={paths.mla}")
        if any(layer.mlp.kind == "moe" for layer in layers):
            parts.append(f"moe={paths.moe}")
        if self.device.type == "cpu" and TORCH_DTYPES[self.config.engine.dtype] == torch.bfloat16:
            parts.append(f"elementwise={paths.elementwise_in_use()}")
        return " ".join(parts)

    def reset(self, policy: str, snapshot_interval_blocks: int | None = None) -> None:
        """Empty the cache (KV tensors need no clearing: nothing reads an unwritten block) and,
        for a hybrid model, take snapshots every `snapshot_interval_blocks` blocks from now on
        (None: keep the grid). The state tensors are reallocated when the new grid needs
        another number of slots."""
        if snapshot_interval_blocks is not None and snapshot_interval_blocks < 1:
            raise ValueError(
                f"snapshot_interval_blocks must be >= 1, got {snapshot_interval_blocks}"
            )
        with self.lock:
            self.policy = get_policy(policy, runtime=True)
            if snapshot_interval_blocks is not None:
                self.pool_args = (*self.pool_args[:-1], snapshot_interval_blocks)
            pool = stage_pool(*self.pool_args)
            slots = pool.num_slots if pool.keeps_snapshots else None  # hybrid: snapshot slots
            if self.kv is None or slots != self._num_state_slots:
                self.kv = None  # the old tensors go before the new ones are allocated
                self.kv = self.model.new_kv_cache(
                    self.num_blocks,
                    self.config.engine.block_size,
                    **({"num_state_slots": slots} if slots else {}),
                )
                self._num_state_slots = slots
            pool.host_tier = self._host_tier()
            if self.config.engine.publishes_kv_events:  # drained by each cache query
                attach_block_log(pool, max(4 * self.num_blocks, MIN_BLOCK_LOG_CHANGES))
            self.server = StageServer(self.stage_id, pool, self._store_tier())
            # idle time is counted from here, not across the reset
            self.epoch = time.perf_counter()

    def _host_tier(self) -> HostTier | None:
        """An empty host KV tier over this stage's pools (host_kv_gib of host memory, allocated
        once, kept across resets), or None without one. Its bytes are copies of self.kv's."""
        capacity_bytes = int(self.config.engine.host_kv_gib * 2**30)
        if not capacity_bytes:
            return None
        if self.host_kv is None or self.host_kv.pools is not self.kv:
            self.host_kv = None  # the old tensors go before the new ones are allocated
            self.host_kv = HostKVStore(self.kv, capacity_bytes)
        self.host_kv.clear()
        return HostTier(
            capacity_bytes,
            self.host_kv.block_bytes,
            self.host_kv.snapshot_bytes,
            store=self.host_kv,
        )

    def _store_client(self) -> MooncakeStoreClient | None:
        """A client of the shared KV store (kv_tier), from the address this machine reaches
        its master from (or kv_host); None without one."""
        engine = self.config.engine
        if engine.kv_tier is None:
            return None
        master = cast(str, engine.kv_tier_master)
        return MooncakeStoreClient(
            master,
            engine.kv_tier_metadata,
            engine.kv_host or local_host_for(master.rsplit(":", 1)[0]),
            int(engine.kv_tier_segment_gib * 2**30),
            timeout_s=engine.kv_tier_timeout_s,
        )

    def _store_tier(self) -> StoreTier | None:
        """This stage's view of the shared store: its blocks under a namespace naming the
        checkpoint, the page layout, the dtype, the block size and this stage's layers. A
        reset (not the start) empties that namespace: the store is part of the caches it
        empties, for every replica that shares it."""
        if self.store_client is None:
            return None
        reset = self.store_kv is not None  # not the engine's start: empty this namespace
        if self.store_kv is None or self.store_kv.pools is not self.kv:
            if self.store_kv is not None:
                self.store_kv.close()
            self.store_kv = StoreKVBlocks(self.kv, self.store_client)
        if self.store_namespace is None:
            engine = self.config.engine
            self.store_namespace = (
                f"wavepp/{checkpoint_fingerprint(self.config.model_path)}/"
                f"{self.layout.architecture}/{engine.dtype}/b{engine.block_size}/"
                f"l{self.spec.start_layer}-{self.spec.end_layer}"
            )
        tier = StoreTier(self.store_namespace, self.store_kv.block_bytes, self.store_kv)
        if reset:
            tier.clear()
        return tier

    @property
    def snapshot_interval_blocks(self) -> int:
        """The snapshot grid of this stage's pool, in blocks (0: a model without snapshots)."""
        return getattr(self.server.pool, "interval_blocks", 0)

    def capacity(self):
        """This stage's pool capacity now (a `CapacityView`), read under the stage lock."""
        with self.lock:
            return self.server.pool.capacity()

    def check_integrity(self) -> IntegrityReport:
        """The pool's check_integrity() (raises on a broken invariant), then what it holds."""
        with self.lock:
            self.server.pool.check_integrity()
            return IntegrityReport(self.server.pool.capacity(), len(self.server.requests))

    def query(self, items) -> tuple:
        """A cache query's answer here: (hints, capacity, counters, block changes), under the
        stage lock; which blocks the shared store holds is asked before, without it
        (StageTiers.prefetch). The block changes are the pool's BlockLog drained (KV cache
        events; empty without them)."""
        server = self.server
        held = server.prefetch(ProbeMsg(-1, tuple(items))) if items else None
        with self.lock:
            server = self.server  # (a reset may have come between: its server answers)
            log = server.pool.block_log
            return (
                server.query(items, held),
                server.pool.capacity(),
                server.counters(),
                BlockChanges() if log is None else log.drain(),
            )

    def handle_round(self, msg):
        """Answer a rounds-plane message under the stage lock; a lease's store bytes are
        fetched before, without it (StageTiers.prefetch)."""
        server = self.server
        prefetched = server.prefetch(msg)
        with self.lock:
            if server is not self.server:  # a reset came between: its new server decides
                prefetched = None
            return self.server.handle(msg, prefetched)

    def run(self, wave: Wave, inputs: torch.Tensor | None) -> tuple[object, float]:
        """Run `wave` here. inputs: token ids [num_tokens] on the first stage, else hidden
        [num_tokens, hidden_size]. Returns (hidden, seconds) or, on the last stage,
        (list of TokenResult for chunks that end their request, seconds)."""
        with self.lock:
            prepared = self.server.prepare(wave)
        t0 = time.perf_counter()
        output = None
        if prepared:
            chunks = [
                ChunkSpec(
                    p.chunk.start,
                    p.chunk.num_tokens,
                    p.block_table,
                    p.chunk.request_id,
                    p.state_in,
                    p.state_saves,
                )
                for p in prepared
            ]
            # index tensors built on the host, then one copy each to the device (none on the CPU)
            batch = StageBatch.build(chunks, self.config.engine.block_size).to(self.device)
            rows = _output_rows(wave) if self.spec.is_last else None
            if rows is not None:
                rows = (rows[0].to(self.device, non_blocking=True), rows[1])
            if inputs is not None:
                inputs = inputs.to(self.device, non_blocking=True)
            kwargs = {"kernels": self.kernel_choice.kernels, **rows_kwarg(rows)}
            if self.spec.is_first:
                output = self.model(batch, self.kv, input_ids=inputs, **kwargs)
            else:
                output = self.model(batch, self.kv, hidden_states=inputs, **kwargs)
            if self.spec.is_last:
                output = self._first_tokens(wave, output, rows)
        synchronize(self.device)  # on a GPU the forward runs behind the host: count all of it
        seconds = time.perf_counter() - t0
        if self.exporter is not None:
            # copied before complete(): a block the pool reuses afterwards cannot change it
            for p in prepared:
                if p.chunk.export_id is not None:
                    self.exporter.submit(
                        p.chunk.export_id,
                        self.exporter.writer.stage(self.kv, p.block_table, p.chunk.end),
                        p.chunk.end,
                        p.chunk.request_id,
                    )
        with self.lock:
            self.server.complete(wave)
        if output is None and self.spec.is_last:
            output = []
        return output, seconds

    def _first_tokens(self, wave: Wave, logits: torch.Tensor, rows) -> list:
        """TokenResults of the chunks that end their request, and PromptLogprobs of the chunks
        that ask for them. logits: [num_chunks, vocab] fp32 (one row per chunk: its last
        token), or with prompt logprobs one row per position `rows` lists."""
        # last[i]: the row of chunk i's last token
        if rows is None:
            last = list(range(len(wave.chunks)))
        else:
            last = list(itertools.accumulate(len(r) for r in rows[1]))
            last = [n - 1 for n in last]
        wanted = [i for i, c in enumerate(wave.chunks) if c.is_last or c.logprob_start is not None]
        if not wanted:
            return []
        logprobs = torch.log_softmax(logits, dim=-1)
        k = min(max(1, self.config.engine.top_k), logprobs.shape[-1])
        top_lp, top_ids = torch.topk(logprobs, k, dim=-1)
        results = []
        for i in wanted:
            c = wave.chunks[i]
            if c.is_last:
                ids, lps = top_ids[last[i]].tolist(), top_lp[last[i]].tolist()
                results.append(
                    TokenResult(
                        c.request_id,
                        ids[0],
                        lps[0],
                        tuple(ids[: self.config.engine.top_k]),
                        tuple(lps[: self.config.engine.top_k]),
                    )
                )
            if c.logprob_start is not None:
                # rows of positions [logprob_start, logprob_start + n) of this chunk
                first = last[i] - (c.end - 1 - c.logprob_start)
                n = len(c.logprob_token_ids)
                targets = torch.tensor(
                    c.logprob_token_ids, dtype=torch.int64, device=logprobs.device
                )
                lps = logprobs[first : first + n].gather(1, targets[:, None])[:, 0]
                results.append(
                    PromptLogprobs(
                        c.request_id,
                        c.logprob_start,
                        tuple(lps.tolist()),
                        tuple(map(tuple, top_ids[first : first + n].tolist())),
                        tuple(map(tuple, top_lp[first : first + n].tolist())),
                    )
                )
        return results
