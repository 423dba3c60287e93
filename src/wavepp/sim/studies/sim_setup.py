"""What one simulated setting is made of (SimSetup: the model, hardware, pipeline, precision
and the frameworks' mechanisms; AdmissionCosts) and what it returns (SimResult). The setting is
built and run in scenario.py."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from wavepp.sim.cost.hardware import HardwareSpec
from wavepp.sim.cost.model_shapes import ModelShape
from wavepp.sim.cost.stage_cost import ExecOverheads
from wavepp.sim.cost.stages import MemoryBudget
from wavepp.sim.loops.loop_costs import LoopCosts
from wavepp.sim.loops.sglang import SGLANG_LEGACY, SglangMechanisms
from wavepp.sim.loops.trtllm import TRTLLM_LEGACY, TrtllmMechanisms
from wavepp.sim.loops.vllm_pp import VLLM_LEGACY, VllmMechanisms


@dataclass(frozen=True)
class AdmissionCosts:
    """Rounds-plane costs of the runtime's pure-Python admission on a server's host CPU.

    Per-block costs come from timing this project's BlockPool on the 2-core development VM
    (lease 0.66 us per pinned block; reserve + commit 4.9 us per new block, 16-token blocks)
    and assume a server core about 1.4x faster. The latency is one way between local
    processes over the rounds plane (gloo over TCP loopback plus Python: ~100 us; assumption).
    """

    round_latency_s: float = 100e-6
    msg_s: float = 50e-6  # per message per stage: receive, dispatch, reply
    item_s: float = 10e-6  # per request in a message
    leased_block_s: float = 0.5e-6
    new_block_s: float = 3.5e-6
    leader_item_s: float = 5e-6  # the leader's work per request per phase
    block_tokens: int = 64  # the runtime's block size the per-block costs are for

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0:
                raise ValueError(f"AdmissionCosts.{name} must be >= 0, got {value}")
        if self.block_tokens <= 0:
            raise ValueError("AdmissionCosts.block_tokens must be positive")


@dataclass(frozen=True)
class SimSetup:
    model: ModelShape
    hardware: HardwareSpec
    num_devices: int  # the PP degree; for tp-ep, the TP/EP degree
    token_scale: int = 16  # real tokens per simulated token
    block_size: int = 16  # simulated tokens per block
    max_wave_tokens: int = 0  # real tokens: the largest wave (M) of the balanced planner;
    # 0: from the profiling pass (efficient_wave_tokens)
    min_wave_tokens: int = 1024  # real tokens: the smallest budget (mpu)
    max_round_requests: int = 64
    max_pool_blocks: int = 1 << 22  # cap on blocks per pool (memory may allow more)
    internode: bool = False  # every stage on its own node: every boundary crosses the NIC
    # GPUs per node (0: all in one NVLink domain): a stage boundary between nodes and a TP/EP
    # group spanning nodes go over the NICs (ConnectX), the rest over NVLink
    gpus_per_node: int = 0
    # a host (CPU) KV tier of this many GiB per rank (0: none), for the systems that run
    # wavepp's own caches (`SystemSpec.host_tier`), or every system with `host_tier_for_baselines`
    host_kv_gib: float = 0.0
    # a KV store every replica's stages share (Mooncake Store), this many GiB in all (0: none),
    # below each stage's host tier (sim/core/shared_store.py); for the same systems as the
    # host tier. A fetch costs `store_fetch_latency_s` (the store's lookup and the read set up:
    # an assumption) plus its bytes over the stage's store link, one direction (0: its NIC,
    # `hardware.internode_gb_s`)
    kv_tier_gib: float = 0.0
    store_link_gb_s: float = 0.0
    store_fetch_latency_s: float = 500e-6
    # the host tier and the shared store for every system, not only wavepp's own caches
    host_tier_for_baselines: bool = False
    admission: AdmissionCosts = field(default_factory=AdmissionCosts)
    overheads: ExecOverheads = field(default_factory=ExecOverheads)
    memory: MemoryBudget = field(default_factory=MemoryBudget)
    loop_costs: LoopCosts = field(default_factory=LoopCosts)  # trtllm-pp, sglang-pp
    trtllm: TrtllmMechanisms = (
        TRTLLM_LEGACY  # TensorRT-LLM's mechanisms in trtllm-pp (sim/loops/trtllm.py)
    )
    sglang: SglangMechanisms = (
        SGLANG_LEGACY  # SGLang's mechanisms in sglang-pp (sim/loops/sglang.py)
    )
    vllm: VllmMechanisms = VLLM_LEGACY  # vLLM's mechanisms in vllm-pp (sim/loops/vllm_pp.py)
    # hybrid models: stages keep state snapshots every this many blocks (slots, leases, escrow,
    # in-flight sharing: the runtime's SnapshotPool); 0: the grid the runtime picks for the model
    # (`model_interval_blocks`)
    snapshot_interval_blocks: int = 0
    # real tokens: the fixed budget of static, trtllm-pp, vllm-pp, tp-ep and dp-ep (per device)
    # in place of each one's default (sim/studies/systems.py BUDGETED); 0: the defaults
    budget_tokens: int = 0
    # the pipeline's layers per stage: "auto", balanced on each layer's cost (the runtime's
    # layer_split="auto"); "even", the count split (sim/cost/stages.py partition_layers)
    layer_split: str = "auto"
    # the waves "auto" balances each layer's time on, per wave its chunks' (num_cached,
    # num_new) in real tokens; (): sim/cost/stages.py REFERENCE_WAVE, or, through `run_setting`,
    # the workload's prompts packed into waves (scenario.py `balanced_on`)
    balance_waves: tuple[tuple[tuple[int, int], ...], ...] = ()

    def __post_init__(self) -> None:
        if self.layer_split not in ("auto", "even"):
            raise ValueError(
                f"SimSetup.layer_split must be 'auto' or 'even', got {self.layer_split!r}"
            )
        if self.max_wave_tokens < 0:
            raise ValueError(f"SimSetup.max_wave_tokens must be >= 0, got {self.max_wave_tokens}")
        if self.budget_tokens < 0:
            raise ValueError(f"SimSetup.budget_tokens must be >= 0, got {self.budget_tokens}")
        if self.snapshot_interval_blocks < 0:
            raise ValueError(
                f"SimSetup.snapshot_interval_blocks must be >= 0, got {self.snapshot_interval_blocks}"
            )
        if self.gpus_per_node < 0 or self.host_kv_gib < 0:
            raise ValueError(
                f"SimSetup.gpus_per_node and host_kv_gib must be >= 0, "
                f"got {self.gpus_per_node}, {self.host_kv_gib}"
            )
        for name in ("kv_tier_gib", "store_link_gb_s", "store_fetch_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"SimSetup.{name} must be >= 0, got {getattr(self, name)}")
        if self.kv_tier_gib and self.model.hybrid:
            raise ValueError(
                f"SimSetup.kv_tier_gib: {self.model.name} keeps recurrent-state snapshots, "
                "which the simulator's shared store does not model yet (the runtime's carries "
                "them)"
            )
        if self.host_kv_gib and not self.hardware.host_link_gb_s:
            raise ValueError(
                f"SimSetup.host_kv_gib: {self.hardware.name} has no host link bandwidth"
            )
        for name in (
            "num_devices",
            "token_scale",
            "block_size",
            "min_wave_tokens",
            "max_round_requests",
            "max_pool_blocks",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"SimSetup.{name} must be positive, got {getattr(self, name)}")
        if self.num_devices > self.model.num_layers:
            raise ValueError(
                f"SimSetup: {self.num_devices} stages for {self.model.num_layers} layers"
            )

    def crosses_nodes(self, stage_id: int) -> bool:
        """Whether the boundary from pipeline stage `stage_id` to the next (the last: back to
        rank 0) crosses nodes; GPU i holds stage i."""
        if self.internode:
            return True
        nxt = (stage_id + 1) % self.num_devices
        return (
            bool(self.gpus_per_node) and stage_id // self.gpus_per_node != nxt // self.gpus_per_node
        )

    @property
    def store_link_bytes_s(self) -> float:
        """One direction of a stage's link to the shared store: `store_link_gb_s`, else the
        device's NIC."""
        return (self.store_link_gb_s or self.hardware.internode_gb_s) * 1e9

    @property
    def num_nodes(self) -> int:
        """Nodes the devices span."""
        return -(-self.num_devices // self.gpus_per_node) if self.gpus_per_node else 1

    def sim_tokens(self, real_tokens: int) -> int:
        """Simulated tokens for `real_tokens`, at least one block's worth."""
        return max(1, round(real_tokens / self.token_scale))


@dataclass(frozen=True)
class SimResult:
    system: str
    model: str
    hardware: str
    num_devices: int
    workload: str
    concurrency: int
    num_requests: int
    num_failed: int
    input_tok_s: float  # real input tokens per second of virtual time
    seconds: float
    hit_rate: float
    ideal_hit_rate: float
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    stage_utilization: float  # mean over execution stages
    idle_admission_frac: float  # mean over stages: idle or blocked waiting for admission
    num_waves: int
    round_latency_p50_s: float
    # hybrid models: what an infinite cache could reuse at the snapshot grid's resolution
    ideal_hit_rate_on_grid: float | None = None
    # host KV tier, summed over the stages: blocks offloaded to it, and loaded back from it
    host_offloaded_blocks: int = 0
    host_loaded_blocks: int = 0
    # the shared KV store, summed over the stages: blocks fetched from it and landed
    store_loaded_blocks: int = 0

    def row(self) -> dict:
        return asdict(self)
