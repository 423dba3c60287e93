"""One stage's compute: its model slice, its paged KV tensors, its BlockPool and StageServer.

    run(wave, tokens | hidden) -> hidden (or, on the last stage, TokenResults)

prepare (materialize blocks, check the plan) and complete (publish, free) happen under the
stage lock, since the WAVE thread may be answering a round on the same pool meanwhile; the
forward itself runs outside the lock.
"""

from __future__ import annotations

import threading
import time

import torch

from wavepp.cache import BlockPool
from wavepp.models import ChunkSpec, StageBatch, load_model_config, load_stage_model, page_layout, stage_specs
from wavepp.runtime.config import RuntimeConfig
from wavepp.sched import StageServer, TokenResult, Wave
from wavepp.sched.policy import get_policy

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def stage_num_blocks(config: RuntimeConfig, model_config, stage_id: int) -> int:
    """Blocks of this stage: given, or what kv_cache_gib holds for its layers."""
    if config.stage_num_blocks:
        return config.stage_num_blocks[stage_id]
    spec = stage_specs(model_config.num_layers, config.num_stages)[stage_id]
    return page_layout(model_config).num_blocks(int(config.kv_cache_gib * 2**30), spec.start_layer,
                                                spec.end_layer, config.block_size,
                                                _DTYPES[config.dtype].itemsize)


class StageRuntime:
    def __init__(self, config: RuntimeConfig, stage_id: int):
        self.config = config
        self.stage_id = stage_id
        self.model_config = load_model_config(config.model_path)
        self.spec = stage_specs(self.model_config.num_layers, config.num_stages)[stage_id]
        self.model = load_stage_model(config.model_path, self.spec, _DTYPES[config.dtype])
        self.num_blocks = stage_num_blocks(config, self.model_config, stage_id)
        self.kv = self.model.new_kv_cache(self.num_blocks, config.block_size)
        self.lock = threading.Lock()
        self.reset(config.policy)

    def reset(self, policy: str) -> None:
        """Empty the cache (KV tensors need no clearing: nothing reads an unwritten block)."""
        with self.lock:
            self.policy = get_policy(policy)
            self.server = StageServer(self.stage_id, BlockPool(self.num_blocks, self.config.block_size))
            # idle time is counted from here, not across the reset
            self.epoch = time.perf_counter()

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
            chunks = [ChunkSpec(p.chunk.start, p.chunk.num_tokens, p.block_table, p.chunk.request_id)
                      for p in prepared]
            batch = StageBatch.build(chunks, self.config.block_size)
            if self.spec.is_first:
                output = self.model(batch, self.kv, input_ids=inputs)
            else:
                output = self.model(batch, self.kv, hidden_states=inputs)
            if self.spec.is_last:
                output = self._first_tokens(wave, output)
        seconds = time.perf_counter() - t0
        with self.lock:
            self.server.complete(wave)
        if output is None and self.spec.is_last:
            output = []
        return output, seconds

    def _first_tokens(self, wave: Wave, logits: torch.Tensor) -> list[TokenResult]:
        # logits: [num_chunks, vocab] fp32; only chunks that end their request yield a token
        rows = [i for i, c in enumerate(wave.chunks) if c.is_last]
        if not rows:
            return []
        logprobs = torch.log_softmax(logits[rows], dim=-1)
        k = min(max(1, self.config.top_k), logprobs.shape[-1])
        top_lp, top_ids = torch.topk(logprobs, k, dim=-1)
        results = []
        for j, i in enumerate(rows):
            ids, lps = top_ids[j].tolist(), top_lp[j].tolist()
            results.append(TokenResult(wave.chunks[i].request_id, ids[0], lps[0],
                                       tuple(ids[:self.config.top_k]), tuple(lps[:self.config.top_k])))
        return results
