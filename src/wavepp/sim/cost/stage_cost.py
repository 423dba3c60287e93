"""Time of one wave on one stage, from first principles: FLOPs, bytes and link transfers.

For a wave of chunks (L cached tokens, x new tokens each), T = sum of x, every layer costs

    projections   2*T*P_attn FLOPs as GEMMs of T rows        (P_attn: attention weights)
    attention     per (query, key) pair: GQA 4*h*d; MLA 2*h*(d_qk + d_v); DSA keeps top-k keys
                  per query (absorbed latents: 2*h*(2*r + d_rope)) plus an indexer over every
                  key (2*h_idx*d_idx, FP8); linear attention a per-token recurrence
                  pairs of a chunk: L*x + x*(x+1)/2 (causal)
    re-expansion  MLA without DSA runs prefill in MHA form: each chunk up-projects the cached
                  latents of its L prefix tokens again: 2*L*r*h*(d_nope + d_v) FLOPs
    MLP           dense: 2*T*3*H*I; MoE: routed experts 2*T*k*3*H*I_e as grouped GEMMs of
                  T*k/E rows each, the shared expert as a GEMM of T rows, the router
    small kernels everything else a layer runs (sim/cost/small_kernels.py): norms, RoPE, the
                  KV cache writes, MLA's key and value build, each low-precision GEMM's input
                  quantized, SiLU-and-mul, routing, the MoE permutes, and a floor per launch

A GEMM runs at peak * efficiency * rows / (rows + half_rows) (tiles fill poorly with few rows:
the per-expert token count of a small wave) and never faster than reading its weights from
HBM (roofline). Attention runs in the model's attention dtype (bf16 or fp8) at that dtype's
kernel efficiency, lower for chunks of few queries, and never faster than reading the cached KV.
`degree` > 1 spreads a stage over `degree` devices, in one of two layouts:

    tp   tensor-parallel attention (heads split, weights split), experts split (EP); per layer
         an all-reduce of the attention output, the MoE all-to-all and an all-gather (a dense
         MLP: a second all-reduce)
    dp   data-parallel attention (each device runs its own requests through the whole attention
         block and the dense layers, weights replicated), experts split (EP): per MoE layer
         only DeepEP's dispatch and combine; a wave waits for its busiest device
         (sim/cost/dp_attention.py)

The collectives run over the links (over the NICs where the devices span `num_nodes` > 1 nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from wavepp.sim.cost.dp_attention import dp_breakdown
from wavepp.sim.cost.execution import DEFAULT_EXECUTION, Execution
from wavepp.sim.cost.expert_balance import imbalance
from wavepp.sim.cost.hardware import HardwareSpec
from wavepp.sim.cost.model_shapes import ModelShape
from wavepp.sim.cost.small_kernels import SmallKernels

LAYOUTS = ("tp", "dp")  # how a stage's `degree` devices share its layers (module docstring)

ChunkShape = tuple[int, int]  # (num_cached, num_new), real tokens

# Chunk length of the chunkwise linear-attention (KDA / gated delta rule) kernels: FLA's
# default chunk size of 64 (fla-org/flash-linear-attention chunk_kda).
LINEAR_CHUNK = 64


@dataclass(frozen=True)
class ExecOverheads:
    """Per-wave costs outside the kernels' math. Assumptions, not measurements: the order of
    the host-side scheduling and launch gaps SGLang's overlap scheduler exists to hide."""

    wave_s: float = 1e-3  # per wave per stage: plan, block tables, launches, sync
    chunk_s: float = 2e-5  # per chunk: its metadata
    small_kernels: bool = True  # charge the forward's other kernels (sim/cost/small_kernels.py)

    def __post_init__(self) -> None:
        for name in ("wave_s", "chunk_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"ExecOverheads.{name} must be >= 0")


class StageCostModel:
    """Compute time of waves on one stage holding layers [start, end) of `model`."""

    def __init__(
        self,
        model: ModelShape,
        hw: HardwareSpec,
        start: int,
        end: int,
        *,
        first: bool = False,
        last: bool = False,
        degree: int = 1,
        overheads: ExecOverheads = ExecOverheads(),
        snapshot_interval_tokens: int = 0,
        num_nodes: int = 1,
        layout: str = "tp",
        execution: Execution = DEFAULT_EXECUTION,
    ):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if not 0 <= start < end <= model.num_layers:
            raise ValueError(f"layers [{start}, {end}) outside the model's {model.num_layers}")
        if degree <= 0:
            raise ValueError(f"degree must be positive, got {degree}")
        if not 1 <= num_nodes <= degree:
            raise ValueError(f"num_nodes must be in [1, degree={degree}], got {num_nodes}")
        self.model, self.hw = model, hw
        self.start, self.end = start, end
        self.first, self.last, self.degree = first, last, degree
        self.num_nodes = num_nodes  # nodes the `degree` devices span (collectives cross NICs)
        self.layout = layout
        self.overheads = overheads
        self.execution = execution
        self._small = SmallKernels(model, hw) if overheads.small_kernels else None
        # dp: one device of the group, running its own chunks through every layer but the
        # routed experts (sim/cost/dp_attention.py)
        self.device = (
            StageCostModel(
                model,
                hw,
                start,
                end,
                first=first,
                last=last,
                overheads=overheads,
                snapshot_interval_tokens=snapshot_interval_tokens,
                execution=execution,
            )
            if layout == "dp" and degree > 1
            else None
        )
        # hybrid models: a chunk loads the state it resumes from and saves one at every
        # snapshot boundary it crosses and at its end (0: snapshots not charged)
        self.snapshot_interval_tokens = snapshot_interval_tokens
        self.snapshot_bytes = model.layers_snapshot_bytes(start, end)
        # identical layers cost the same: group them as (linear?, moe?) -> count
        kinds: dict[tuple[bool, bool], int] = {}
        for i in range(start, end):
            key = (model.is_linear(i), model.is_moe(i))
            kinds[key] = kinds.get(key, 0) + 1
        self._kinds = kinds
        self.num_moe_layers = sum(count for (_, moe), count in kinds.items() if moe)
        self._rep = {
            key: next(i for i in range(start, end) if (model.is_linear(i), model.is_moe(i)) == key)
            for key in kinds
        }

    @property
    def num_layers(self) -> int:
        return self.end - self.start

    def wave_seconds(self, chunks: Sequence[ChunkShape]) -> float:
        return sum(self.breakdown(chunks).values())

    def breakdown(self, chunks: Sequence[ChunkShape]) -> dict[str, float]:
        """Seconds by cost term, summed over this stage's layers."""
        out: dict[str, float] = {}
        if not chunks:
            return out
        if self.layout == "dp" and self.degree > 1:
            return self._streamed(dp_breakdown(self, chunks))
        for key, count in self._kinds.items():
            for name, seconds in self._layer(self._rep[key], chunks).items():
                out[name] = out.get(name, 0.0) + count * seconds
        ov = self.overheads
        out["overhead"] = ov.wave_s + ov.chunk_s * len(chunks)
        if self.snapshot_interval_tokens and self.snapshot_bytes:
            out["snapshots"] = self.snapshot_copy_seconds(chunks)
        if self.last:
            m, num_last = self.model, len(chunks)  # at most one final token per chunk
            out["lm_head"] = self._gemm(
                2.0 * num_last * m.hidden_size * m.vocab_size / self.degree,
                num_last,
                m.vocab_size * m.hidden_size * 2 / self.degree,
                "bf16",
            )
        return self._streamed(out)

    def _streamed(self, out: dict[str, float]) -> dict[str, float]:
        """`out` with the routed-expert weights streamed from host memory (Execution
        `streamed_experts`): the wave takes at least their transfer over the host link, the
        part beyond its compute as "weight_stream"."""
        share = self.execution.streamed_experts
        if not share or not self.num_moe_layers:
            return out
        m, hw = self.model, self.hw
        if not hw.host_link_gb_s:
            raise ValueError(f"{hw.name} has no host link to stream expert weights over")
        per_device = self.num_moe_layers * m.routed_expert_bytes() / self.degree
        stream = share * per_device / hw.host_link_bytes_s
        total = sum(out.values())
        if stream > total:
            out["weight_stream"] = stream - total
        return out

    def snapshot_copy_seconds(self, chunks: Sequence[ChunkShape]) -> float:
        """HBM time of the state snapshots of `chunks`: one read where a chunk resumes (L > 0),
        one write per snapshot boundary it crosses, and one at its end."""
        step = self.snapshot_interval_tokens
        copies = sum(int(L > 0) + (L + x) // step - L // step + 1 for L, x in chunks)
        return copies * self.snapshot_bytes / self.degree / self.hw.hbm_bytes_s

    # ---- one layer ---------------------------------------------------------------------------

    def _layer(self, layer: int, chunks: Sequence[ChunkShape]) -> dict[str, float]:
        m, hw, n = self.model, self.hw, self.degree
        T = sum(x for _, x in chunks)
        out = {"projections": self._projections(layer, T)}
        # one kernel runs the wave's chunks: its tiles (every head's query tiles, each chunk's
        # keys split in blocks of ATTN_SPLIT_KEYS as split-KV kernels do) fill the SMs or not
        tiles = (
            m.num_heads
            / n
            * sum(
                math.ceil(x / ATTN_TILE_ROWS) * max(1, (L + x) // ATTN_SPLIT_KEYS)
                for L, x in chunks
            )
        )
        sm_fill = 1.0 if m.is_linear(layer) else min(1.0, tiles / hw.num_sms)
        out["attention"] = sum(self._attention(layer, L, x) for L, x in chunks) / sm_fill
        if m.attention == "mla" and not m.sparse_attention and not m.is_linear(layer):
            r, h = m.kv_lora_rank, m.num_heads
            up = r * h * (m.qk_nope_head_dim + m.v_head_dim)
            out["reexpansion"] = sum(
                self._gemm(2.0 * L * up / n, L, 0.0, m.gemm_dtype) for L, _ in chunks if L > 0
            )
        if m.is_moe(layer):
            e = m.num_experts
            out["moe_routed"] = self.routed_seconds(T)
            if m.num_shared_experts:
                ps = m.num_shared_experts * m.expert_params()
                out["moe_shared"] = self._gemm(
                    2.0 * T * ps / n, T, ps * m.weight_bytes / n, m.gemm_dtype
                )
            out["router"] = self._gemm(
                2.0 * T * m.hidden_size * e / n, T, m.hidden_size * e * 2 / n, "bf16"
            )
        else:
            p = m.mlp_params(layer)
            out["mlp"] = self._gemm(2.0 * T * p / n, T, p * m.weight_bytes / n, m.gemm_dtype)
        if self._small is not None:
            context = sum(L + x for L, x in chunks)
            small = self._small.seconds(layer, T, context, share=1.0 / n)
            out["small_kernels"] = sum(small.values())
        if n > 1:
            out["collectives"] = self._collectives(layer, T)
        return out

    def routed_seconds(self, T: float) -> float:
        """One MoE layer's routed experts over T tokens, the experts split over the stage's
        devices (EP): grouped GEMMs of T*k/E rows per expert, never faster than reading the
        weights of the experts that receive a token."""
        m, n = self.model, self.degree
        e, k = m.num_experts, m.num_experts_per_tok
        touched = e * (1.0 - (1.0 - k / e) ** T)  # experts that receive a token
        p = m.expert_params()
        busiest = imbalance(n, self.execution.placement)  # sim/cost/expert_balance.py
        return self._gemm(
            2.0 * T * k * p / n * busiest,
            T * k / e * busiest,
            touched * p * m.weight_bytes / n,
            m.gemm_dtype,
        )

    def _projections(self, layer: int, T: int) -> float:
        """The attention block's projections, a GEMM per weight format; heads split over the
        devices, but the MLA down-projections to the q and kv latents ("q_a", "kv_a") are
        replicated on each."""
        m, n = self.model, self.degree
        replicated = ("q_a", "kv_a") if n > 1 else ()
        by_format: dict[tuple[float, str], float] = {}
        for name, params in m.attention_param_groups(layer).items():
            share = params if name in replicated else params / n
            key = m.projection_format(name)
            by_format[key] = by_format.get(key, 0.0) + share
        return sum(
            self._gemm(2.0 * T * p, T, p * wb, dtype) for (wb, dtype), p in by_format.items()
        )

    def _attention(self, layer: int, L: int, x: int) -> float:
        m, hw, n = self.model, self.hw, self.degree
        fill = attention_fill(hw, L, x)
        if m.is_linear(layer):  # the chunkwise recurrence runs in bf16
            dk = dv = m.linear_head_dim
            flops = 2.0 * x * m.linear_num_heads * (2 * dk * dv + LINEAR_CHUNK * (dk + dv))
            return flops / n / (hw.peak_flops("bf16") * hw.attn_efficiency * fill)
        rate = hw.peak_flops(m.attn_dtype) * hw.attn_efficiency_of(m.attn_dtype) * fill
        pairs = L * x + x * (x + 1) / 2
        # the cached KV each device reads: its heads' (GQA) or the whole latent (MLA, replicated)
        kv_read = (L + x) * m.kv_bytes_per_token(layer) / kv_split(m, n)
        if m.attention == "gqa":
            flops = pairs * 4.0 * m.num_heads * m.head_dim
            return max(flops / n / rate, kv_read / hw.hbm_bytes_s)
        h, r, rope = m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim
        if not m.sparse_attention:
            flops = pairs * 2.0 * h * (m.qk_nope_head_dim + rope + m.v_head_dim)
            return max(flops / n / rate, kv_read / hw.hbm_bytes_s)
        kept = sparse_pairs(L, x, m.index_topk)
        main = kept * 2.0 * h * (2 * r + rope)
        index = pairs * 2.0 * m.index_n_heads * m.index_head_dim  # the indexer runs in FP8
        fp8 = hw.peak_flops("fp8") * hw.fp8_attn_efficiency * fill
        return max(main / n / rate + index / n / fp8, kv_read / hw.hbm_bytes_s)

    def _gemm(self, flops: float, rows: float, weight_bytes: float, dtype: str) -> float:
        if flops <= 0:
            return 0.0
        hw = self.hw
        eff = hw.gemm_efficiency_of(dtype) * rows / (rows + hw.gemm_half_rows)
        return max(flops / (hw.peak_flops(dtype) * eff), weight_bytes / hw.hbm_bytes_s)

    def _collectives(self, layer: int, T: int) -> float:
        """TP attention: all-reduce of its output; EP MoE: all-to-all dispatch (FP8) and combine
        (bf16) of each token's k expert copies, and an all-gather. No overlap with compute is
        assumed. On one node every step runs over NVLink. When the devices span `num_nodes`
        nodes, each device with its own NIC (`internode_gb_s`, one direction): a ring (all-reduce,
        all-gather) passes every byte over every hop, so its slowest hop, the NIC, sets the rate
        (NCCL's bus bandwidth across nodes is the NIC's: nccl-tests doc/PERFORMANCE.md); an
        all-to-all sends each peer its share at once, the shares to the other nodes' devices over
        the NIC beside the rest over NVLink; each step pays the NIC's latency."""
        m, hw, n = self.model, self.hw, self.degree
        across = self.num_nodes > 1
        ring, lat = (
            (hw.internode_bytes_s, hw.internode_latency_s)
            if across
            else (hw.link_bytes_s, hw.link_latency_s)
        )
        hidden_bytes = T * m.hidden_size * 2.0
        seconds = 2.0 * (n - 1) / n * hidden_bytes / ring + lat  # ring all-reduce
        if not m.is_moe(layer):
            return seconds + 2.0 * (n - 1) / n * hidden_bytes / ring + lat  # MLP all-reduce
        k, per_node = m.num_experts_per_tok, n / self.num_nodes
        sent = T / n * k * m.hidden_size * (1.0 + 2.0)  # dispatch FP8 + combine bf16
        remote = sent * (n - per_node) / n  # to the other nodes' devices
        local = sent * (per_node - 1) / n  # to this node's others
        gather = (n - 1) / n * hidden_bytes  # every rank needs all tokens
        all_to_all = (
            max(remote / hw.internode_bytes_s, local / hw.link_bytes_s)
            if across
            else local / hw.link_bytes_s
        ) * imbalance(n, self.execution.placement)  # the busiest expert device's share
        return seconds + all_to_all + gather / ring + 3 * lat


# The shape the hardware's attention efficiencies are measured at (sim/cost/hardware.py): causal
# self-attention over 16,384 tokens, 8,192 keys per query on average
ATTN_REFERENCE_KEYS = 8192.0
ATTN_TILE_ROWS = 128  # the query rows of one tile of the attention kernels (FA3, cuDNN, FA4)
# a chunk of few query tiles has its keys split over more SMs (split-KV: FlashDecoding, FA3's
# num_splits), each split at least this many keys (an assumption: 4 key tiles)
ATTN_SPLIT_KEYS = 512


def attention_fill(hw: HardwareSpec, num_cached: int, num_new: int) -> float:
    """Attention's rate for a chunk, as a fraction of the hardware's long-sequence efficiency:
    keyed on its tile work, the keys each query block runs over (mean L + (x + 1) / 2 for
    causal attention), k / (k + attn_half_keys), relative to the reference shape's; and a
    chunk whose last query tile is part full pays for the whole tile. (The wave's tiles over
    the SMs are `_layer`'s.) attn_half_keys from NVIDIA's cudnn-frontend sweeps of causal
    prefill (benchmark/attention_training/results: H200 Llama-3.1 and DeepSeek-V3 shapes,
    GB200 and GB300 DeepSeek-V3 and Llama-3.1, BF16 and FP8, 2K-32K tokens): k / (k + h)
    fits each within 3% rms, h 340-560 keys on H200 (470, the median) and 540-700 on GB200
    and GB300 (610)."""
    keys = num_cached + (num_new + 1) / 2
    half = hw.attn_half_keys
    ramp = (keys / (keys + half)) / (ATTN_REFERENCE_KEYS / (ATTN_REFERENCE_KEYS + half))
    return ramp * num_new / (math.ceil(num_new / ATTN_TILE_ROWS) * ATTN_TILE_ROWS)


def kv_split(model: ModelShape, degree: int, layout: str = "tp") -> int:
    """Over how many devices a stage's KV cache spreads: dp, all (each holds its own
    requests'); tp, GQA's KV heads (an MLA latent is replicated on each)."""
    if layout == "dp":
        return degree
    return min(degree, model.num_kv_heads) if model.attention == "gqa" else 1


def sparse_pairs(num_cached: int, num_new: int, topk: int) -> float:
    """sum over queries i in [L, L + x) of min(i + 1, topk): keys each query attends to."""
    a, b = num_cached, num_cached + num_new - 1
    # [a, min(b, topk-1)]: i + 1 keys each | [max(a, topk), b]: topk keys each
    lo_end = min(b, topk - 1)
    first = (lo_end - a + 1) * (a + 1 + lo_end + 1) / 2 if lo_end >= a else 0.0
    hi_start = max(a, topk)
    second = (b - hi_start + 1) * topk if b >= hi_start else 0.0
    return first + second


def transfer_seconds(
    model: ModelShape, hw: HardwareSpec, num_tokens: int, *, internode: bool = False
) -> float:
    """Hidden states [num_tokens, hidden] in bf16 from one stage to the next."""
    data = num_tokens * model.hidden_size * 2.0
    if internode:
        return hw.internode_latency_s + data / hw.internode_bytes_s
    return hw.link_latency_s + data / hw.link_bytes_s
