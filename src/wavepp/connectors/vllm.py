"""A vLLM KV connector (consumer) that loads what wavepp's stages handed on into vLLM's paged
cache, over Mooncake's transfer engine or from the directory store.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "WavePPConnector",
        "kv_connector_module_path": "wavepp.connectors.vllm", "kv_role": "kv_consumer",
        "kv_connector_extra_config": {}}'

`kv_connector_extra_config` may hold `"host"` (the address this side's transfer engine uses;
default: the one on the route to the prefill's stages), `"protocol"` ("tcp" or "rdma"),
`"store": DIR` (to also read the directory transport), `"transfer_timeout_s"` (a pull that
makes no progress for this long fails, one from a host that stopped answering within twice
it, and vLLM computes the prompt; default 10),
`"recompute_failed_loads": false` (keep vLLM's own `kv_load_failure_policy`; by default the
connector sets it to "recompute", so a pull that fails is computed, never an error nor a wrong
token), `"async_load": true` (a pull runs off vLLM's step, below; by default it runs inside the
step that schedules the request, holding up the whole batch meanwhile: see
docs/disaggregation.md for why the default is still that).

What vLLM calls, in order, for a request whose params name the stages' parts (async_load):
1. scheduler, `get_num_new_matched_tokens`: the params checked (no network); (n, True): n
   tokens will load, asynchronously;
2. scheduler, `update_state_after_alloc` with the request's blocks: the load recorded; vLLM
   parks the request in WAITING_FOR_REMOTE_KVS, its blocks held;
3. scheduler, `build_connector_meta`: the load goes to the workers with the next step;
4. worker, `start_load_kv` (after that step's forward): the pull is handed to a thread of its
   own (`kv_transfer.mooncake.background`); the step goes on with the rest of the batch;
5. worker, `start_load_kv` of a later step: a pull that ended has its rows written into the
   request's blocks (a step with no forward waits up to 10 ms for one, so vLLM's loop does
   not spin), its parts released on their stages;
6. worker, `get_transfer_results` of that step: the request in `finished_recving` (and in
   `failed_recving` if its pull failed: vLLM computes it whole);
7. scheduler: the request is scheduled with every loaded token computed;
   `request_finished` when it ends. A request that comes back (a failed load, a preemption)
   is not pulled again: its parts were released.
The store's transfers, and the stages' parts with async_load false, load inside the step that
schedules the request (`start_load_kv` before its forward); a part that fails there marks its
blocks in `get_block_ids_with_load_errors`. Each pull's wait, pull and load times, bytes and
outcome are in vLLM's connector stats and on its /metrics (`connectors/vllm_metrics.py`).

A completion request carries `kv_transfer_params` = the `kv_transfer` that wavepp's prefill
returned ({"transfer_id", ...}). With the Mooncake transport they say, per stage, where its
part lies (the stage's transfer engine session, addresses, layout); the scheduler side checks
them against the request and this model (the prompt's digest, layers, pools, widths: no
network) and tells vLLM how many prompt tokens load: every one but the last (vLLM computes it
for its logits), whatever vLLM's block size. The worker side pulls each stage's part with its
own transfer engine, straight from that stage's memory, checks the part was not freed while it
was read, loads it, and releases it on the stage. A pull that fails (a stage gone, a part
freed by its TTL or for room) marks the request's blocks as failed loads: vLLM computes them.
With the directory store the scheduler side finds the transfer in the store
(`wavepp.kv_transfer.directory.store`: every stage's part there, every checksum good, the same
prompt, the same layer shapes) and reads and verifies a transfer once per request, however
often vLLM asks (`kv_transfer.decode_plan.DecodePlanner`). The worker side writes those tokens'
K and V into each attention layer through the layer's own `do_kv_cache_update`
(`vllm_cache.py`), so the cache takes the layout of the backend that runs (on the CPU: K and V
rows per block, repacked for AMX or the vector ISA). An MLA model (DeepSeek-V3) takes one
`latent` pool per layer instead, rows [c | k_rope] (kv_lora_rank + qk_rope_head_dim: the
latent after kv_a_layernorm, the RoPE key after rotation), written through the MLA backend's
own `do_kv_cache_update(kv_c_normed, k_pe, ...)` (CPU_MLA and AMX_MLA keep one [c | k_pe] row per
slot: [num_blocks, block_size, kv_lora_rank + rope]). A transfer that is missing, expired,
incomplete past `wait_s`, failed (kv_transfer_params with "error": a stage could not write
its part), corrupt, or of another model (other pools or widths) makes vLLM compute the prompt
itself (logged, counted in `num_misses`): slower, never a wrong token. The transfer is dropped
once its request finishes.

This module imports vLLM, torch, safetensors, mooncake and wavepp's kv_transfer modules only
(no wavepp module that pulls in the server's packages): it runs inside vLLM's own environment
with wavepp's `src/` on the path. Attention layers of the Llama family (GQA K/V pools) and MLA
layers (latent pool).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from wavepp.connectors.vllm_cache import read_store_rows, write_rows
from wavepp.connectors.vllm_metrics import PullPromMetrics, PullStats
from wavepp.kv_transfer.decode_plan import KV_POOLS, LATENT_POOLS, DecodePlanner
from wavepp.kv_transfer.directory.store import DirectoryStore
from wavepp.kv_transfer.mooncake.background import BackgroundPulls
from wavepp.kv_transfer.mooncake.engine import DEFAULT_TIMEOUT_S
from wavepp.kv_transfer.mooncake.puller import ArenaPuller, PullFailed

log = logging.getLogger(__name__)

# a step with no forward (every request waits for its KV) waits this long for a pull to end,
# so that vLLM's engine loop does not spin meanwhile
IDLE_WAIT_S = 0.01


@dataclass(frozen=True)
class LoadSpec:
    transfer_id: str
    start: int  # tokens [start, end) of the prompt are loaded
    end: int
    block_ids: tuple[int, ...]  # the request's vLLM blocks, from its first token
    block_size: int
    stages: tuple = ()  # the Mooncake transport: each stage's location; empty: the store
    request_id: str = ""
    background: bool = False  # pulled off the step; the request waits for it (async load)


@dataclass
class WavePPConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)


class WavePPConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.DISK

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.store = DirectoryStore(extra["store"]) if extra.get("store") else None
        transport = (
            extra.get("host"),
            extra.get("protocol", "tcp"),
            float(extra.get("transfer_timeout_s", DEFAULT_TIMEOUT_S)),
        )
        self.puller = ArenaPuller(*transport)  # pulls inside the step (async_load false)
        self.async_load = bool(extra.get("async_load", False))
        self.pulls = BackgroundPulls(*transport)  # started by the first background pull
        if extra.get("recompute_failed_loads", True):
            # a part that cannot be pulled is computed by vLLM (the scheduler reads this policy
            # once, after it made its connector)
            self._kv_transfer_config.kv_load_failure_policy = "recompute"
        self._load_errors: set[int] = set()
        self.num_failed_pulls = 0
        self.block_size = vllm_config.cache_config.block_size
        model = vllm_config.model_config
        if model.use_mla:
            hf = model.hf_text_config
            pools, kv_width = LATENT_POOLS, hf.kv_lora_rank + hf.qk_rope_head_dim
            # wavepp (like transformers) rotates DeepSeek's interleaved RoPE pairs (2i, 2i+1) as
            # the de-interleaved vector (x[0::2] | x[1::2]), and exports k_rope in that order;
            # vLLM's DeepSeek MLA rotates in place (is_neox_style=False), so its cache holds the
            # interleaved order
            self._rope_interleave = bool(getattr(hf, "rope_interleave", True))
        else:
            pools, self._rope_interleave = KV_POOLS, False
            kv_width = model.get_num_kv_heads(vllm_config.parallel_config) * model.get_head_size()
        self.planner = DecodePlanner(
            self.store,
            block_size=self.block_size,
            num_layers=model.get_num_layers(vllm_config.parallel_config),
            kv_width=kv_width,
            pools=pools,
            wait_s=float(extra.get("wait_s", 5.0)),
        )
        self.num_loaded_tokens = 0
        # request id -> (transfer, start, end, stage locations)
        self._plans: dict[str, tuple[str, int, int, tuple]] = {}
        self._scheduled: dict[str, str] = {}  # request id -> transfer, until it ends
        self._background: list[LoadSpec] = []  # allocated, for the next step's metadata
        self._pulled: set[str] = set()  # requests whose parts were pulled, until they end
        # worker side: background pulls under way, and those ended since the last step's report
        self._loading: dict[str, LoadSpec] = {}
        self._received: set[str] = set()
        self._failed: set[str] = set()
        self._stats = PullStats()  # since vLLM last took them (get_kv_connector_stats)

    @property
    def num_misses(self) -> int:
        return self.planner.num_misses

    # ---- scheduler side ----------------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Verified once per request (DecodePlanner); None while the stages are still writing.
        A pull from the stages runs off the step (async_load): (n, True)."""
        params = request.kv_transfer_params
        if request.request_id in self._pulled:
            # back after a failed load or a preemption: its parts were released; computed
            return 0, False
        n = self.planner.num_new_tokens(
            request.request_id, params, request.prompt_token_ids or (), num_computed_tokens
        )
        if not n:
            self._plans.pop(request.request_id, None)
            return n, False
        self._plans[request.request_id] = (
            params["transfer_id"],
            num_computed_tokens,
            num_computed_tokens + n,
            tuple(params.get("stages") or ()),
        )
        return n, self.async_load and bool(params.get("stages"))

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        rid = request.request_id
        if num_external_tokens == 0:
            self._plans.pop(rid, None)
            return
        plan = self._plans.get(rid)
        if plan is None or not plan[3] or not self.async_load:
            return  # loaded inside the step that schedules it (build_connector_meta)
        # an async load: vLLM keeps the request waiting with these blocks allocated and
        # schedules it once the worker reported the pull ended
        del self._plans[rid]
        transfer_id, start, end, stages = plan
        self._background.append(
            LoadSpec(
                transfer_id,
                start,
                end,
                tuple(blocks.get_block_ids()[0]),
                self.block_size,
                stages,
                request_id=rid,
                background=True,
            )
        )
        self._pulled.add(rid)
        self.num_loaded_tokens += end - start

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = WavePPConnectorMetadata(loads=self._background)
        self._background = []
        for new in scheduler_output.scheduled_new_reqs:
            self.planner.forget(new.req_id)  # scheduled: vLLM asks again only after a preemption
            plan = self._plans.pop(new.req_id, None)
            if plan is None:
                continue
            transfer_id, start, end, stages = plan
            meta.loads.append(
                LoadSpec(transfer_id, start, end, tuple(new.block_ids[0]), self.block_size, stages)
            )
            if stages:
                self._pulled.add(new.req_id)
            else:  # the store's transfer is removed when the request ends
                self._scheduled[new.req_id] = transfer_id
            self.num_loaded_tokens += end - start
        return meta

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        """The request ended: its transfer has been read; drop it from the store."""
        self._plans.pop(request.request_id, None)
        self._pulled.discard(request.request_id)
        self.planner.forget(request.request_id)
        transfer_id = self._scheduled.pop(request.request_id, None)
        if transfer_id is not None and self.store is not None:
            self.store.remove(transfer_id)
        return False, None

    # ---- worker side -------------------------------------------------------------------------
    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        loads = meta.loads if isinstance(meta, WavePPConnectorMetadata) else []
        for load in loads:
            if load.background:
                self._loading[load.request_id] = load
                self.pulls.submit(load.request_id, list(load.stages), load.start, load.end)
                continue
            if not load.stages:
                write_rows(
                    forward_context, load, read_store_rows(self.store, load), self._rope_interleave
                )
                continue
            t0 = time.monotonic()
            try:
                rows = self._pull(load)
            except PullFailed as err:
                self._stats.record(0.0, time.monotonic() - t0, 0.0, 0, ok=False)
                self._fail_load(load, err)
                continue
            self._load_pulled(forward_context, load, rows, 0.0, time.monotonic() - t0)
            self.puller.release(list(load.stages))
        if self._loading:
            self._write_pulled(forward_context)

    def _write_pulled(self, forward_context) -> None:
        """The rows of the background pulls that ended, into vLLM's cache (the requests they are
        for wait: no forward reads those blocks); reported in this step's transfer results."""
        idle = getattr(forward_context, "attn_metadata", None) is None
        for end in self.pulls.finished(IDLE_WAIT_S if idle else 0.0):
            load = self._loading.pop(end.key)
            if isinstance(end.result, PullFailed):
                self._stats.record(end.wait_s, end.pull_s, 0.0, 0, ok=False)
                self._log_failure(load, end.result)
                self._failed.add(end.key)
                self.pulls.done(end.key, list(load.stages), end.result.unreachable_host)
            else:
                self._load_pulled(forward_context, load, end.result, end.wait_s, end.pull_s)
                self.pulls.done(end.key, list(load.stages))
            self._received.add(end.key)

    def _load_pulled(self, forward_context, load: LoadSpec, rows, wait_s, pull_s) -> None:
        t0 = time.monotonic()
        write_rows(forward_context, load, rows, self._rope_interleave)
        nbytes = sum(t.numel() * t.element_size() for p in rows.values() for t in p.values())
        self._stats.record(wait_s, pull_s, time.monotonic() - t0, nbytes, ok=True)

    def get_kv_connector_stats(self) -> PullStats | None:
        """The pulls since vLLM last asked (vllm_metrics.py: on its /metrics)."""
        if self._stats.is_empty():
            return None
        stats, self._stats = self._stats, PullStats()
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> PullStats:
        return PullStats(data=data) if data is not None else PullStats()

    @classmethod
    def build_prom_metrics(
        cls, vllm_config, metric_types, labelnames, per_engine_labelvalues
    ) -> PullPromMetrics:
        return PullPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """The background pulls whose rows were written this step, and those that failed (in
        both sets, as vLLM wants them: it computes the failed ones)."""
        received, self._received = self._received, set()
        failed, self._failed = self._failed, set()
        return KVConnectorTransferResults(finished_recving=received, failed_recving=failed)

    def shutdown(self) -> None:
        self.pulls.close()
        self.puller.close()

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks of this step's loads whose pull failed: vLLM computes them."""
        failed, self._load_errors = self._load_errors, set()
        return failed

    def _pull(self, load: LoadSpec) -> dict[int, dict[str, torch.Tensor]]:
        """model layer -> pool -> rows [end - start, width] of tokens [start, end)."""
        return self.puller.pull(list(load.stages), load.start, load.end)

    def _fail_load(self, load: LoadSpec, err: PullFailed) -> None:
        first, last = load.start // load.block_size, (load.end - 1) // load.block_size
        self._load_errors.update(load.block_ids[first : last + 1])
        self._log_failure(load, err)
        # not to a host that just failed a read: the write would wait out the timeout again
        self.puller.release(list(load.stages), skip_host=err.unreachable_host)

    def _log_failure(self, load: LoadSpec, err: PullFailed) -> None:
        self.num_failed_pulls += 1
        log.warning(
            "KV transfer %s could not be pulled (%s): vLLM computes tokens [%d, %d)",
            load.transfer_id,
            err,
            load.start,
            load.end,
        )

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any
    ) -> None:
        return  # a consumer: nothing is saved

    def wait_for_save(self) -> None:
        return
