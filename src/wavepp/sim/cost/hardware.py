"""Accelerator specs for the cost model, from vendor datasheets.

Peak numbers are dense (no 2:4 sparsity) tensor-core throughput. Links: `link_gb_s` is the
NVLink bandwidth per GPU as NVIDIA quotes it (both directions together); a point-to-point
transfer or a collective step moves data at half of it, one direction. Efficiencies are
what the best kernels reach on large shapes; each cites the measurement it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    bf16_tflops: float  # dense peak
    fp8_tflops: float  # dense peak
    hbm_gb: float
    hbm_tb_s: float
    link_gb_s: float  # NVLink per GPU, bidirectional total
    link_latency_s: float  # one small NVLink transfer (NCCL p2p), end to end
    internode_gb_s: float  # NIC per GPU, one direction
    internode_latency_s: float
    gemm_efficiency: float = 0.70  # large GEMMs, fraction of peak
    attn_efficiency: float = 0.72  # long-sequence bf16 attention kernels, fraction of bf16 peak
    fp8_attn_efficiency: float = 0.51  # long-sequence fp8 attention kernels, fraction of fp8 peak
    gemm_half_rows: int = 32  # rows per GEMM (tokens per expert) at half efficiency: tile fill
    # attention's ramp on its tile work: keys per query at which a kernel reaches half its rate
    # (the efficiencies above are at ATTN_REFERENCE_KEYS; a chunk of fewer than ATTN_TILE_ROWS
    # queries fills part of its query tiles)
    attn_half_keys: float = 470.0
    num_sms: int = 132  # streaming multiprocessors (the exchange's kernels hold some)
    small_kernel_bw_efficiency: float = 0.80  # the forward's small kernels, fraction of HBM rate
    kernel_floor_s: float = 2e-6  # the GPU's gap between back-to-back queued kernels
    nvfp4_tflops: float = 0.0  # dense peak of block-scaled FP4 (0: no FP4 tensor cores)
    nvfp4_gemm_efficiency: float = 0.43  # large NVFP4 GEMMs, fraction of their peak
    host_link_gb_s: float = 0.0  # GPU <-> host (CPU) memory, bidirectional total (0: not modelled)

    def __post_init__(self) -> None:
        for name in (
            "bf16_tflops",
            "fp8_tflops",
            "hbm_gb",
            "hbm_tb_s",
            "link_gb_s",
            "internode_gb_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"HardwareSpec.{name} must be positive, got {getattr(self, name)}")
        for name in ("nvfp4_tflops", "host_link_gb_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"HardwareSpec.{name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "gemm_efficiency",
            "attn_efficiency",
            "fp8_attn_efficiency",
            "nvfp4_gemm_efficiency",
        ):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(
                    f"HardwareSpec.{name} must be in (0, 1], got {getattr(self, name)}"
                )

    def peak_flops(self, dtype: str) -> float:
        if dtype == "bf16":
            return self.bf16_tflops * 1e12
        if dtype == "fp8":
            return self.fp8_tflops * 1e12
        if dtype == "nvfp4":
            if not self.nvfp4_tflops:
                raise ValueError(f"{self.name} has no FP4 tensor cores (nvfp4)")
            return self.nvfp4_tflops * 1e12
        raise ValueError(f"unknown dtype {dtype!r} (bf16, fp8 or nvfp4)")

    def gemm_efficiency_of(self, dtype: str) -> float:
        """Large GEMMs' fraction of the peak of `dtype`."""
        return self.nvfp4_gemm_efficiency if dtype == "nvfp4" else self.gemm_efficiency

    def attn_efficiency_of(self, dtype: str) -> float:
        """Long-sequence attention kernels' fraction of the peak of `dtype` (bf16 | fp8)."""
        if dtype == "bf16":
            return self.attn_efficiency
        if dtype == "fp8":
            return self.fp8_attn_efficiency
        raise ValueError(f"unknown attention dtype {dtype!r} (bf16 or fp8)")

    @property
    def hbm_bytes_s(self) -> float:
        return self.hbm_tb_s * 1e12

    @property
    def link_bytes_s(self) -> float:
        """One direction of the GPU's NVLink."""
        return self.link_gb_s * 1e9 / 2

    @property
    def host_link_bytes_s(self) -> float:
        """One direction of the GPU's link to host memory (a host tier's loads and offloads)."""
        return self.host_link_gb_s * 1e9 / 2

    @property
    def internode_bytes_s(self) -> float:
        """The GPU's NIC, one direction."""
        return self.internode_gb_s * 1e9


# GEMM efficiency 0.70: DeepGEMM (deepseek-ai/DeepGEMM README) reaches up to ~1550 FP8 TFLOPS
#   on H800 for large dense shapes (78% of 1979) and 1200-1500 for grouped MoE shapes; 0.70 is
#   the middle of that range. On Blackwell, vLLM's SM100 FP8 CUTLASS GEMM on B200
#   (vllm-project/vllm#19566, bench_fp8_gemm.py, "fp8-channel-w-token-a-noquant") reaches 3,204
#   TFLOPS at 2,048 rows, 71% of 4.5 PF: the same fraction.
# Attention efficiency, forward (prefill) kernels on long causal sequences, each a kernel
#   measurement against the datasheet peak of its dtype:
#   H100/H200: FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608) reaches ~740 TFLOPS FP16
#     (75% of 989) and close to 1.2 PFLOPS FP8 (61% of 1979).
#   B200: FlashAttention-4 / cuDNN ~1600 TFLOPS BF16 (71% of 2250); FP8: GB200's fraction below
#     (the same SM; B200's datasheet peak is lower), an assumption.
#   GB200 and GB300: NVIDIA/cudnn-frontend benchmark/attention_training/results/dsv3/{gb200,gb300}
#     (cuDNN 9.27, 2026-09-28): DeepSeek-V3's MLA prefill shape (128 heads, d_qk 192, d_v 128,
#     batch 2 x 16,384 tokens, causal), "cudnn" backend forward: GB200 1,683 TFLOPS BF16 (67% of
#     2,500) and 2,532 FP8 (51% of 5,000); GB300 2,061 BF16 (82%) and 3,393 FP8 (68%). Blackwell
#     Ultra doubles the SFU's exponential rate (NVIDIA, "Making Softmax More Efficient with NVIDIA
#     Blackwell Ultra": ~35% more FP8 attention forward throughput than GB200), which the two
#     measurements show. B300: GB300's fractions (the same Blackwell Ultra SM), an assumption.
# NVFP4 GEMM efficiency 0.43: vLLM's NVFP4 CUTLASS GEMM benchmark on B200
#   (vllm-project/vllm#20646, benchmarks/kernels/bench_nvfp4_gemm.py, "nvfp4-noquant": the GEMM
#   alone) reaches 3,904 TFLOPS at 16,384 rows (N = 6,144, K = 4,096), 43% of B200's 9 PF dense
#   FP4. The activations' quantization is charged apart (sim/cost/stage_cost.py). Assumed the same
#   on B300, GB200 and GB300.
# Attention's ramp (attn_half_keys): sim/cost/stage_cost.py `attention_fill`, with its sweeps.
# SMs: H100 and H200 SXM 132 (NVIDIA H100 Tensor Core GPU architecture whitepaper); the full
#   Blackwell Ultra (B300, GB300) 160 (NVIDIA, "Inside NVIDIA Blackwell Ultra", 2025); B200 and
#   GB200 148, as CUDA reports them (an assumption: no datasheet gives the count).
# Small kernels (sim/cost/small_kernels.py): 0.80 of the HBM rate is an assumption (long copies
#   reach about 0.9 of HBM3 on an H100; the small kernels' reads of several strided tensors less).
#   Its check: DeepSeek-V3 at 16,384 tokens a device on H100 gives 4.9 ms a layer of them
#   (tests/sim/test_small_kernels.py), where SGLang's breakdown of DeepSeek's own H800 prefill
#   profile shows 5.1 ms of "other kernels" and of SGLang's 6.2 ms (LMSYS blog 2025-05-05,
#   "Prefill Time Breakdown"). kernel_floor_s: the median gap between back-to-back queued
#   kernels in DeepSeek's H800 trace (deepseek-ai/profile-data train.json: 2 us, p10 1, p90 3).
# Link latency: NCCL point-to-point of small messages over NVLink takes ~5-10 us (nccl-tests
#   sendrecv_perf at 8 B); inter-node RDMA ~10 us.
# Host link (a host KV tier's loads and offloads): PCIe x16, bidirectional totals from the PCI-SIG
#   specifications: Gen5 (32 GT/s) 128 GB/s, Gen6 (64 GT/s) 256 GB/s. GB300: NVLink-C2C between
#   the Grace CPU and each Blackwell GPU, 900 GB/s bidirectional (NVIDIA's Grace superchip
#   material: a "900 GB/s coherent interface, 7X faster than PCIe Gen 5"; a GB300 NVL compute
#   tray holds 4 GPUs and 2 Grace CPUs, NVIDIA's GB300 NVL72 Enterprise Reference Architecture,
#   "System Hardware & Components"), so 450 GB/s one way.
# NVIDIA H100 SXM5 datasheet: 989 TF BF16 / 1979 TF FP8 dense, 80 GB HBM3 at 3.35 TB/s, NVLink 4
# 900 GB/s; ConnectX-7 400 Gb/s per GPU (DGX H100).
_H100 = HardwareSpec(
    "H100",
    989.0,
    1979.0,
    80.0,
    3.35,
    900.0,
    8e-6,
    50.0,
    10e-6,
    attn_efficiency=0.75,
    fp8_attn_efficiency=0.61,
    host_link_gb_s=128.0,
)

HARDWARE: dict[str, HardwareSpec] = {
    h.name: h
    for h in (
        _H100,
        # Meta's Grand Teton H100 hosts, as "Context Parallelism for Scalable Million-Token
        # Inference" (Yang et al., MLSys 2025, arXiv 2411.01783, appendix A) states them: power
        # limited to 500 W, 96 GB HBM2e at 2.4 TB/s, a BF16 peak of 800 TF "instead of 989";
        # NVLink within the host, 400 Gb/s RDMA per GPU between hosts. FP8 at twice the BF16
        # peak and H100's kernel efficiencies are assumptions (the same SM, lower clocks).
        replace(
            _H100, name="H100-GTT", bf16_tflops=800.0, fp8_tflops=1600.0, hbm_gb=96.0, hbm_tb_s=2.4
        ),
        # NVIDIA H200 SXM datasheet: same compute as H100, 141 GB HBM3e at 4.8 TB/s, NVLink 900
        # GB/s.
        replace(_H100, name="H200", hbm_gb=141.0, hbm_tb_s=4.8),
        # NVIDIA HGX B200 datasheet (per GPU): 2.25 PF BF16 / 4.5 PF FP8 / 9 PF FP4 dense (72 PF
        # for 8 GPUs), 180 GB HBM3e at 8 TB/s, NVLink 5 1.8 TB/s; ConnectX-7 400 Gb/s (DGX B200).
        HardwareSpec(
            "B200",
            2250.0,
            4500.0,
            180.0,
            8.0,
            1800.0,
            8e-6,
            50.0,
            10e-6,
            nvfp4_tflops=9000.0,
            host_link_gb_s=128.0,
            attn_half_keys=610.0,
            num_sms=148,
        ),
        # NVIDIA HGX B300 (Blackwell Ultra) datasheet (per GPU): 2.25 PF BF16 / 4.5 PF FP8 dense,
        # FP4 13.5 PF dense (108 PF for 8 GPUs, 144 with sparsity), 288 GB HBM3e at 8 TB/s, NVLink 5
        # 1.8 TB/s; ConnectX-8 800 Gb/s per GPU. (NVIDIA's "Inside Blackwell Ultra" blog gives the
        # full GPU 15 PF dense NVFP4: GB300, at 1.4 kW.)
        # Host link: PCIe Gen6 x16 (HGX B300).
        HardwareSpec(
            "B300",
            2250.0,
            4500.0,
            288.0,
            8.0,
            1800.0,
            8e-6,
            100.0,
            10e-6,
            attn_efficiency=0.82,
            fp8_attn_efficiency=0.68,
            nvfp4_tflops=13500.0,
            host_link_gb_s=256.0,
            attn_half_keys=610.0,
            num_sms=160,
        ),
        # NVIDIA GB300 NVL72 datasheet, per GPU (the rack's 72): 2.5 PF BF16 / 5 PF FP8 / 15 PF FP4
        # dense (1,080 PF FP4 dense for 72 GPUs), 288 GB HBM3e at 8 TB/s, NVLink 5 1.8 TB/s;
        # ConnectX-8 800 Gb/s per GPU between nodes (4 ConnectX-8 per 4-GPU compute tray, the
        # Enterprise RA above; 800 Gb/s XDR link speed, ConnectX-8 SuperNIC firmware release notes).
        # Host link: NVLink-C2C to the Grace CPU, 900 GB/s.
        HardwareSpec(
            "GB300",
            2500.0,
            5000.0,
            288.0,
            8.0,
            1800.0,
            8e-6,
            100.0,
            10e-6,
            attn_efficiency=0.82,
            fp8_attn_efficiency=0.68,
            nvfp4_tflops=15000.0,
            host_link_gb_s=900.0,
            attn_half_keys=610.0,
            num_sms=160,
        ),
        # NVIDIA GB200 NVL72 datasheet, per GPU (the rack's 72): 2.5 PF BF16 / 5 PF FP8 / 10 PF FP4
        # dense (360 / 720 / 1,440 PF for 72 GPUs, with sparsity), 13.4 TB HBM3e at 576 TB/s
        # (186 GB at 8 TB/s each), NVLink 5 1.8 TB/s (130 TB/s for 72); ConnectX-7 400 Gb/s per GPU
        # between racks (4 per 4-GPU compute tray). Host link: NVLink-C2C to the Grace CPU,
        # 900 GB/s (as GB300).
        HardwareSpec(
            "GB200",
            2500.0,
            5000.0,
            186.0,
            8.0,
            1800.0,
            8e-6,
            50.0,
            10e-6,
            attn_efficiency=0.67,
            fp8_attn_efficiency=0.51,
            nvfp4_tflops=10000.0,
            host_link_gb_s=900.0,
            attn_half_keys=610.0,
            num_sms=148,
        ),
    )
}


def get_hardware(name: str) -> HardwareSpec:
    key = name.upper()
    if key not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; choose one of {', '.join(HARDWARE)}")
    return HARDWARE[key]
