"""The paper's evaluation grids, reconstructed, and a runner for any list of settings.

paper  GLM-5-class and MiniMax-M2-class on PP4 B300, every PP policy, concurrency
       8, 16, 32, 64, 128, four workloads (2 x 4 x 5 = 40 settings), in the paper's setup:
       NVFP4 weights with FP8 attention over an FP8 KV cache (`PAPER_PRECISION`), `trtllm-pp` as
       TensorRT-LLM 1.3.0rc26 runs it (sim/loops/trtllm.py `TRTLLM_RC26`) and the paper's
       16,384-token microbatch as wavepp's M; `paper_grid("legacy")` is the earlier setup (the
       models' FP8 weights, bf16 attention and cache, `TRTLLM_LEGACY`, M from the profiling
       pass):
         cold          8k-token prompts, nothing shared
         mixed         75% warm (8 groups sharing 90% of an 8k prompt), 25% cold, interleaved
         reuse         8 groups sharing 90% of an 8k prompt
         short_suffix  8 groups sharing a 28k-token prefix, each with its own 4k-token suffix
kimi   Kimi-K2-class on 8 B300: every PP8 policy and TP8/EP8 `tp-ep`; cold and 90%-reuse (4 groups) prompts of 64k, 128k and 256k tokens at
       concurrency 1, 2, 4, 8, 16, 32 (2 x 3 x 6 = 36 settings)

The paper states the models, hardware, workload kinds and concurrencies; prompt lengths,
group counts and request counts are this reconstruction's choices. Each setting runs
max(32, 4 x concurrency) requests in a closed loop.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from wavepp.sim.cost.hardware import get_hardware
from wavepp.sim.cost.model_catalog import get_model
from wavepp.sim.cost.precision import kv_format, weight_format, with_precision
from wavepp.sim.loops.sglang import get_sglang
from wavepp.sim.loops.trtllm import get_trtllm
from wavepp.sim.loops.vllm_pp import get_vllm
from wavepp.sim.studies.scenario import SimSetup, run_setting
from wavepp.workloads import Workload, WorkloadOptions, workload_from_options


@dataclass(frozen=True)
class WorkloadShape:
    """A workload in real tokens; `build` makes it at a simulator scale."""

    kind: str  # cold | reuse | mixed | short_suffix
    prompt_len: int = 8192  # real tokens (cold, reuse, mixed)
    prefix_len: int = 0  # real tokens (short_suffix)
    suffix_len: int = 0
    num_groups: int = 8
    reuse_ratio: float = 0.9

    @property
    def label(self) -> str:
        if self.kind == "short_suffix":
            return f"short_suffix-{_k(self.prefix_len)}+{_k(self.suffix_len)}"
        return f"{self.kind}-{_k(self.prompt_len)}"

    def build(self, num_requests: int, setup: SimSetup, seed: int = 0) -> Workload:
        s = setup.sim_tokens
        return workload_from_options(
            self.kind,
            WorkloadOptions(
                num_requests=num_requests,
                prompt_len=s(self.prompt_len),
                prefix_len=s(self.prefix_len),
                suffix_len=s(self.suffix_len),
                num_groups=self.num_groups,
                reuse_ratio=self.reuse_ratio,
                common={"block_size": setup.block_size, "seed": seed},
            ),
        )


@dataclass(frozen=True)
class GridSetting:
    grid: str
    model: str
    hardware: str
    pp: int
    workload: WorkloadShape
    concurrency: int
    policies: tuple[str, ...]
    token_scale: int = 16
    block_size: int = 16
    max_wave_tokens: int = 0  # 0: from the profiling pass
    num_requests: int = field(default=0)  # 0: max(32, 4 x concurrency)
    weights: str = ""  # bf16 | fp8 | nvfp4 (sim/cost/precision.py); "": the model's own
    attention_dtype: str = ""  # bf16 | fp8; "": the model's own (bf16)
    kv_dtype: str = ""  # bf16 | fp8; "": the model's own (bf16)
    budget_tokens: int = 0  # the fixed budgets in place of the systems' defaults (0: those)
    trtllm: str = "legacy"  # TensorRT-LLM's mechanisms in trtllm-pp (sim/loops/trtllm.py presets)
    snapshot_interval_blocks: int = 0  # hybrid models: real snapshots every this many blocks
    gpus_per_node: int = 0  # 0: one NVLink domain (sim/studies/scenario.py SimSetup)
    host_kv_gib: float = 0.0  # a host KV tier per rank (0: none)
    sglang: str = "legacy"  # SGLang's mechanisms in sglang-pp (sim/loops/sglang.py presets)
    vllm: str = "legacy"  # vLLM's mechanisms in vllm-pp (sim/loops/vllm_pp.py presets)
    layer_split: str = "auto"  # auto: balanced on the layers' costs | even: by count

    def setup(self) -> SimSetup:
        return SimSetup(
            with_precision(
                get_model(self.model),
                weights=self.weights,
                attention=self.attention_dtype,
                kv=self.kv_dtype,
            ),
            get_hardware(self.hardware),
            self.pp,
            token_scale=self.token_scale,
            block_size=self.block_size,
            max_wave_tokens=self.max_wave_tokens,
            trtllm=get_trtllm(self.trtllm),
            snapshot_interval_blocks=self.snapshot_interval_blocks,
            gpus_per_node=self.gpus_per_node,
            host_kv_gib=self.host_kv_gib,
            sglang=get_sglang(self.sglang),
            vllm=get_vllm(self.vllm),
            budget_tokens=self.budget_tokens,
            layer_split=self.layer_split,
        )

    @property
    def requests(self) -> int:
        return self.num_requests or max(32, 4 * self.concurrency)


PAPER_CONCURRENCY = (8, 16, 32, 64, 128)
KIMI_CONCURRENCY = (1, 2, 4, 8, 16, 32)


# The paper's precisions, as TensorRT-LLM serves an NVFP4 checkpoint: NVFP4 linear layers, the
# KV cache in FP8 (ModelOpt's NVFP4 exports declare kv_cache_quant_algo FP8 in the checkpoint's
# quantization config; TensorRT-LLM's KV cache dtype "auto" takes it) and FP8 context attention
# over it (TensorRT-LLM runs its FP8 context FMHA with an FP8 KV cache, forced on since 1.2.0:
# NVIDIA/TensorRT-LLM#12877). (weights, attention, kv)
PAPER_PRECISION = ("nvfp4", "fp8", "fp8")
EARLIER_PRECISION = ("", "bf16", "bf16")  # the setups before: the models' own weights, bf16

# (precision, trtllm preset, the balanced planner's M) of each setup of the paper grid: the
# paper's microbatch limit of 16,384 tokens holds for wavepp as for TensorRT-LLM
# (max_num_tokens); the earlier setup takes M from the profiling pass
PAPER_SETUPS = {
    "paper": (PAPER_PRECISION, "rc26", 16384),
    "legacy": (EARLIER_PRECISION, "legacy", 0),
}


def paper_grid(setup: str = "paper") -> list[GridSetting]:
    if setup not in PAPER_SETUPS:
        raise ValueError(f"unknown paper setup {setup!r}; choose one of {', '.join(PAPER_SETUPS)}")
    (weights, attention, kv), trtllm, max_wave_tokens = PAPER_SETUPS[setup]
    shapes = (
        WorkloadShape("cold"),
        WorkloadShape("mixed"),
        WorkloadShape("reuse"),
        WorkloadShape("short_suffix", prefix_len=28672, suffix_len=4096),
    )
    policies = ("wavepp", "wavepp-mpu", "lockstep", "static", "trtllm-pp", "sglang-pp", "vllm-pp")
    return [
        GridSetting(
            "paper",
            model,
            "B300",
            4,
            shape,
            c,
            policies,
            max_wave_tokens=max_wave_tokens,
            weights=weights,
            attention_dtype=attention,
            kv_dtype=kv,
            trtllm=trtllm,
        )
        for model in ("glm-5", "minimax-m2")
        for shape in shapes
        for c in PAPER_CONCURRENCY
    ]


def kimi_grid() -> list[GridSetting]:
    policies = ("wavepp", "wavepp-mpu", "lockstep", "static", "sglang-pp", "vllm-pp", "tp-ep")
    return [
        GridSetting(
            "kimi",
            "kimi-k2",
            "B300",
            8,
            WorkloadShape(kind, prompt_len=n, num_groups=4),
            c,
            policies,
            token_scale=256,
        )
        for kind in ("cold", "reuse")
        for n in (65536, 131072, 262144)
        for c in KIMI_CONCURRENCY
    ]


# Kimi K3 on 8 GB300 (sim/cost/model_catalog.py "kimi-k3"), against every PP8 policy, TP8/EP8 and
# DP8/EP8 (`dp-ep`): the kimi grid's prompts and concurrencies,
# the paper's chunk budget and M of 16,384 tokens; stages keep state snapshots every 4 blocks
# (16,384 tokens at the grid's token scale of 256), a chunk's worth. The paper's machine: two
# nodes of 4 GPUs (the boundary between stages 3 and 4, and tp-ep's collectives, over the
# ConnectX-8 NICs) and a host KV cache of 128 GiB per rank (wavepp's systems: the paper does not
# say the baselines ran with theirs). `kimi_k3_grid("nvlink")`: the earlier setup, one NVLink
# domain and no host tier. K3 is served in NVFP4 (sim/cost/model_catalog.py); the paper's setup
# takes the paper's precisions above (FP8 attention over an FP8 KV cache in its MLA layers; its
# linear layers stay bf16), the earlier one bf16 attention and cache.
K3_SNAPSHOT_BLOCKS = 4
K3_SETUPS = {  # (gpus_per_node, host_kv_gib, (weights, attention, kv))
    "paper": (4, 128.0, PAPER_PRECISION),
    "nvlink": (0, 0.0, EARLIER_PRECISION),
}


def kimi_k3_grid(setup: str = "paper") -> list[GridSetting]:
    if setup not in K3_SETUPS:
        raise ValueError(f"unknown kimi-k3 setup {setup!r}; choose one of {', '.join(K3_SETUPS)}")
    gpus_per_node, host_kv_gib, (weights, attention, kv) = K3_SETUPS[setup]
    # TP8/EP8 (the paper's TensorRT-LLM baseline) and DP8/EP8 (DP attention: the large-EP recipes')
    policies = (
        "wavepp",
        "wavepp-mpu",
        "lockstep",
        "static",
        "sglang-pp",
        "vllm-pp",
        "tp-ep",
        "dp-ep",
    )
    return [
        GridSetting(
            "kimi-k3",
            "kimi-k3",
            "GB300",
            8,
            WorkloadShape(kind, prompt_len=n, num_groups=4),
            c,
            policies,
            token_scale=256,
            max_wave_tokens=16384,
            snapshot_interval_blocks=K3_SNAPSHOT_BLOCKS,
            gpus_per_node=gpus_per_node,
            host_kv_gib=host_kv_gib,
            weights=weights,
            attention_dtype=attention,
            kv_dtype=kv,
        )
        for kind in ("cold", "reuse")
        for n in (65536, 131072, 262144)
        for c in KIMI_CONCURRENCY
    ]


def ablation_grid() -> list[GridSetting]:
    """The paper's ablation on the kimi grid's settings at concurrency 8, 16, 32: wave admission,
    + lease and escrow, + MPU (and the balanced planner), each over the step before."""
    from wavepp.sim.studies.systems import ABLATION

    return [
        GridSetting(
            "ablation",
            "kimi-k2",
            "B300",
            8,
            WorkloadShape(kind, prompt_len=n, num_groups=4),
            c,
            ABLATION,
            token_scale=256,
        )
        for kind in ("cold", "reuse")
        for n in (65536, 131072, 262144)
        for c in (8, 16, 32)
    ]


GRIDS = {"paper": paper_grid, "kimi": kimi_grid, "kimi-k3": kimi_k3_grid, "ablation": ablation_grid}


def get_grid(name: str, paper_setup: str = "paper") -> list[GridSetting]:
    """The settings of grid `name` (or "all": paper and kimi); the paper and kimi-k3 grids in
    `paper_setup` ("legacy" for the paper grid's earlier setup, "nvlink" for kimi-k3's)."""
    if name == "all":
        return paper_grid(paper_setup) + kimi_grid() + kimi_k3_grid()
    if name not in GRIDS:
        raise ValueError(f"unknown grid {name!r}; choose one of {', '.join(GRIDS)}, all")
    if name in ("paper", "kimi-k3"):
        return GRIDS[name](paper_setup)
    return GRIDS[name]()


def run_grid(settings: Sequence[GridSetting], *, jobs: int = 1) -> list[dict]:
    """One row per (setting, policy), in the order given. `jobs` > 1 runs settings in parallel
    processes (the simulation is deterministic, so the rows do not depend on it)."""
    if jobs <= 1:
        return [row for s in settings for row in run_one(s)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return [row for rows in pool.map(run_one, settings) for row in rows]


def run_one(setting: GridSetting) -> list[dict]:
    setup = setting.setup()
    workload = setting.workload.build(setting.requests, setup)
    rows = []
    for policy in setting.policies:
        result, _ = run_setting(policy, setup, workload, setting.concurrency)
        rows.append(
            {
                "grid": setting.grid,
                "model": setting.model,
                "hardware": setting.hardware,
                **precision_columns(setup),
                "trtllm": setting.trtllm,
                "sglang": setting.sglang,
                "vllm": setting.vllm,
                "pp": setting.pp,
                "workload": setting.workload.label,
                "concurrency": setting.concurrency,
                "policy": policy,
                "input_tok_s": result.input_tok_s,
                "num_requests": result.num_requests,
                "num_failed": result.num_failed,
                "hit_rate": result.hit_rate,
                "ideal_hit_rate": result.ideal_hit_rate,
                "ttft_p50_s": result.ttft_p50_s,
                "ttft_p95_s": result.ttft_p95_s,
                "ttft_p99_s": result.ttft_p99_s,
                "stage_utilization": result.stage_utilization,
                "idle_admission_frac": result.idle_admission_frac,
                "num_waves": result.num_waves,
                "seconds": result.seconds,
                "gpus_per_node": setting.gpus_per_node,
                "host_kv_gib": setting.host_kv_gib,
                "host_offloaded_blocks": result.host_offloaded_blocks,
                "host_loaded_blocks": result.host_loaded_blocks,
            }
        )
    return rows


def precision_columns(setup: SimSetup) -> dict:
    """A row's precision columns: the weights', attention's and the KV cache's formats."""
    m = setup.model
    return {"weights": weight_format(m), "attention_dtype": m.attn_dtype, "kv_dtype": kv_format(m)}


def with_overrides(settings: Iterable[GridSetting], **changes) -> list[GridSetting]:
    """The same settings with some fields replaced (a smaller grid for tests)."""
    return [replace(s, **changes) for s in settings]


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)
