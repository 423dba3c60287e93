"""One stage's compute: its model slice, its paged KV tensors, its BlockPool and StageServer.

    run(wave, tokens | hidden) -> hidden (or, on the last stage, TokenResults)

prepare (materialize blocks, check the plan) and complete (publish, free) happen under the
stage lock, since the WAVE thread may be answering a round on the same pool meanwhile; the
forward itself runs outside the lock.
"""

from __future__ import annotations

import itertools
import os
import threading
import time

import torch

from wavepp.models import (ChunkSpec, StageBatch, cpu_kernels, load_model_config, load_stage_model, page_layout,
                           stage_specs)
from wavepp.models.attention import AttentionChoice, attention_kernel, choose_attention, use_attention
from wavepp.models.kernels import KernelChoice, choose_linear, linear_kernel, linear_shapes, use_linear
from wavepp.models.stage_pool import stage_pool
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.device import synchronize
from wavepp.runtime.protocol import IntegrityReport
from wavepp.sched import PromptLogprobs, StageServer, TokenResult, Wave
from wavepp.sched.policy import get_policy

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}

# The kernel paths are per process (kernels.linear, attention.paged_attention read one choice).
# The first stage started in a process times them on its own shapes; a stage started later in
# the same process (rank 0 of a second Engine, as `wavepp bench` runs one for single-stage)
# reuses that choice instead of timing again and switching the first engine's paths under it:
# engines compared side by side in one process run the same kernels. A path pinned in the
# environment (WAVEPP_LINEAR_KERNEL, WAVEPP_ATTENTION_KERNEL) always wins.
_process_kernels: dict[tuple[str, torch.dtype, str], str] = {}


def _pinned(kind: str) -> bool:
    return bool(os.environ.get(f"WAVEPP_{kind.upper()}_KERNEL"))


def choose_stage_kernels(model: torch.nn.Module, model_config, dtype: torch.dtype,
                         device: torch.device) -> tuple[KernelChoice, AttentionChoice | None]:
    """This process's (linear, attention) paths for a stage of `model`: timed by the first
    stage of the process on this device type and dtype, reused by later ones (a reused
    choice carries no timings); attention None where the model has no GQA attention."""
    key = (device.type, dtype)
    if device.type == "cpu" and dtype == torch.bfloat16:
        cpu_kernels.elementwise_kernels()   # built (the first time on a machine) before any wave
    name = _process_kernels.get((*key, "linear"))
    if name is None or _pinned("linear"):
        linear = choose_linear(linear_shapes(model), dtype, device=device)
        _process_kernels[(*key, "linear")] = linear.name
    else:
        use_linear(name)
        linear = KernelChoice(name, {}, 0.0)
    mc = model_config
    if not (getattr(mc, "num_kv_heads", None) and getattr(mc, "head_dim", None)):
        return linear, None
    name = _process_kernels.get((*key, "attention"))
    if name is None or _pinned("attention"):
        attention = choose_attention(mc.num_kv_heads, mc.num_heads // mc.num_kv_heads, mc.head_dim, dtype,
                                     device=device)
        _process_kernels[(*key, "attention")] = attention.name
    else:
        use_attention(name)
        attention = AttentionChoice(name, {}, {})
    return linear, attention


# The default cache of a stage: room for this many prompts of the model's full length, within
# 1 GiB and within a quarter of the machine's available memory shared by the stages.
DEFAULT_KV_FULL_PROMPTS = 32
DEFAULT_KV_MAX_BYTES = 2**30


def stage_num_blocks(config: RuntimeConfig, model_config, stage_id: int) -> int:
    """Blocks of this stage: given, or what kv_cache_gib holds for its layers, or the default
    (DEFAULT_KV_FULL_PROMPTS full-length prompts, at most DEFAULT_KV_MAX_BYTES and a quarter of
    the available memory over the stages)."""
    if config.stage_num_blocks:
        return config.stage_num_blocks[stage_id]
    spec = stage_specs(model_config.num_layers, config.num_stages)[stage_id]
    layout = page_layout(model_config)
    dtype_bytes = _DTYPES[config.dtype].itemsize
    bytes_per_token = layout.bytes_per_block(spec.start_layer, spec.end_layer, 1, dtype_bytes)
    if config.kv_cache_gib is not None:
        budget = int(config.kv_cache_gib * 2**30)
    else:
        budget = min(DEFAULT_KV_MAX_BYTES, available_memory_bytes() // (4 * config.num_stages),
                     DEFAULT_KV_FULL_PROMPTS * model_config.max_position_embeddings * bytes_per_token)
    return layout.num_blocks(budget, spec.start_layer, spec.end_layer, config.block_size, dtype_bytes)


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


def available_memory_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 8 * 2**30


class StageRuntime:
    def __init__(self, config: RuntimeConfig, stage_id: int, device: torch.device = torch.device("cpu")):
        """Load this stage's slice onto `device` (its weights, KV cache and every index tensor
        of its waves live there; inputs arrive on the host or the data plane's device and are
        moved there)."""
        self.config = config
        self.stage_id = stage_id
        self.device = torch.device(device)
        self.model_config = load_model_config(config.model_path)
        self.spec = stage_specs(self.model_config.num_layers, config.num_stages)[stage_id]
        self.model = load_stage_model(config.model_path, self.spec, _DTYPES[config.dtype]).to(self.device)
        # the kernel paths, measured on this model's shapes (CPUs differ) by the process's first stage
        self.linear_kernel, attention = choose_stage_kernels(self.model, self.model_config,
                                                             _DTYPES[config.dtype], self.device)
        if attention is not None:    # GQA attention (MLA and hybrid layers have their own paths)
            self.attention_kernel = attention
        self._gqa_attention = attention is not None
        self.num_blocks = stage_num_blocks(config, self.model_config, stage_id)
        self.layout = page_layout(self.model_config)
        self.pool_args = (self.layout, self.model_config.num_layers, self.spec, self.num_blocks,
                          config.block_size, _DTYPES[config.dtype].itemsize, config.snapshot_interval_blocks)
        self.kv = None
        self.lock = threading.Lock()
        self.reset(config.policy)

    def kernels(self) -> str:
        """The kernel paths this stage's process runs now, e.g. "linear=packed attention=chunked_cpp".
        The choice is per process: engines sharing one (rank 0 of several in-process engines)
        run the path the last one to start chose."""
        parts = [f"linear={linear_kernel()}"]
        if self._gqa_attention:
            parts.append(f"attention={attention_kernel()}")
        if self.device.type == "cpu" and _DTYPES[self.config.dtype] == torch.bfloat16:
            parts.append(f"elementwise={cpu_kernels.elementwise_kernel()}")
        return " ".join(parts)

    def reset(self, policy: str, snapshot_interval_blocks: int | None = None) -> None:
        """Empty the cache (KV tensors need no clearing: nothing reads an unwritten block) and,
        for a hybrid model, take snapshots every `snapshot_interval_blocks` blocks from now on
        (None: keep the grid). The state tensors are reallocated when the new grid needs
        another number of slots."""
        if snapshot_interval_blocks is not None and snapshot_interval_blocks < 1:
            raise ValueError(f"snapshot_interval_blocks must be >= 1, got {snapshot_interval_blocks}")
        with self.lock:
            self.policy = get_policy(policy, runtime=True)
            if snapshot_interval_blocks is not None:
                self.pool_args = (*self.pool_args[:-1], snapshot_interval_blocks)
            pool = stage_pool(*self.pool_args)
            slots = getattr(pool, "num_slots", None)   # hybrid models: snapshot slots
            if self.kv is None or slots != self._num_state_slots:
                self.kv = None   # the old tensors go before the new ones are allocated
                self.kv = self.model.new_kv_cache(self.num_blocks, self.config.block_size,
                                                  **({"num_state_slots": slots} if slots else {}))
                self._num_state_slots = slots
            self.server = StageServer(self.stage_id, pool)
            # idle time is counted from here, not across the reset
            self.epoch = time.perf_counter()

    @property
    def snapshot_interval_blocks(self) -> int:
        """The snapshot grid of this stage's pool, in blocks (0: a model without snapshots)."""
        return getattr(self.server.pool, "interval_blocks", 0)

    def check_integrity(self) -> IntegrityReport:
        """The pool's check_integrity() (raises on a broken invariant), then what it holds."""
        with self.lock:
            self.server.pool.check_integrity()
            return IntegrityReport(self.server.pool.capacity(), len(self.server.requests))

    def handle_round(self, msg):
        with self.lock:
            return self.server.handle(msg)

    def run(self, wave: Wave, inputs: torch.Tensor | None) -> tuple[object, float]:
        """Run `wave` here. inputs: token ids [num_tokens] on the first stage, else hidden
        [num_tokens, hidden_size]. Returns (hidden, seconds) or, on the last stage,
        (list of TokenResult for chunks that end their request, seconds)."""
        with self.lock:
            prepared = self.server.prepare(wave)
        t0 = time.perf_counter()
        output = None
        if prepared:
            chunks = [ChunkSpec(p.chunk.start, p.chunk.num_tokens, p.block_table, p.chunk.request_id,
                                p.state_in, p.state_saves) for p in prepared]
            # index tensors built on the host, then one copy each to the device (none on the CPU)
            batch = StageBatch.build(chunks, self.config.block_size).to(self.device)
            rows = _output_rows(wave) if self.spec.is_last else None
            if rows is not None:
                rows = (rows[0].to(self.device, non_blocking=True), rows[1])
            if inputs is not None:
                inputs = inputs.to(self.device, non_blocking=True)
            if self.spec.is_first:
                output = self.model(batch, self.kv, input_ids=inputs, **rows_kwarg(rows))
            else:
                output = self.model(batch, self.kv, hidden_states=inputs, **rows_kwarg(rows))
            if self.spec.is_last:
                output = self._first_tokens(wave, output, rows)
        synchronize(self.device)   # on a GPU the forward runs behind the host: count all of it
        seconds = time.perf_counter() - t0
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
        k = min(max(1, self.config.top_k), logprobs.shape[-1])
        top_lp, top_ids = torch.topk(logprobs, k, dim=-1)
        results = []
        for i in wanted:
            c = wave.chunks[i]
            if c.is_last:
                ids, lps = top_ids[last[i]].tolist(), top_lp[last[i]].tolist()
                results.append(TokenResult(c.request_id, ids[0], lps[0], tuple(ids[:self.config.top_k]),
                                           tuple(lps[:self.config.top_k])))
            if c.logprob_start is not None:
                # rows of positions [logprob_start, logprob_start + n) of this chunk
                first = last[i] - (c.end - 1 - c.logprob_start)
                n = len(c.logprob_token_ids)
                targets = torch.tensor(c.logprob_token_ids, dtype=torch.int64, device=logprobs.device)
                lps = logprobs[first:first + n].gather(1, targets[:, None])[:, 0]
                results.append(PromptLogprobs(
                    c.request_id, c.logprob_start, tuple(lps.tolist()),
                    tuple(map(tuple, top_ids[first:first + n].tolist())),
                    tuple(map(tuple, top_lp[first:first + n].tolist()))))
        return results
