"""Every environment switch of wavepp, read here and nowhere else.

Each is read when its function is called, not at import, so a test (or a stage process
started later) sees the environment as it is then.

    variable                      default                 what it does
    WAVEPP_HOME                   ~/.cache/wavepp         where built-in models are converted to
    WAVEPP_LINEAR_KERNEL          (timed)                 pin the projections' path: linear |
                                                          matmul | packed (models/kernels/linear.py)
    WAVEPP_ATTENTION_KERNEL       (timed)                 pin the attention kernel: chunked |
                                                          cascade | sdpa | chunked_cpp |
                                                          cascade_cpp, or varlen on CUDA
                                                          (models/kernels/attention.py)
    WAVEPP_ELEMENTWISE_KERNEL     cpp                     torch: keep torch's ops instead of the
                                                          fused C++ SiLU-and-mul, RMSNorm, RoPE
    WAVEPP_NO_CPP_KERNELS         (unset)                 any value: build no C++ kernel at all
                                                          (softmax and elementwise run torch's)
    WAVEPP_MOONCAKE_TRACE         ../shared/data/...      the Mooncake trace the `trace` workload
                                                          replays
    MC_LOG_LEVEL                  WARNING                 Mooncake's transfer engine's own log
                                                          level (its INFO lines are per peer);
                                                          set, it is left as it is
    MC_TCP_PROGRESS_TIMEOUT_SEC   (written)               set from --kv-transfer-timeout-s (the
                                                          stages) or the connector's
                                                          transfer_timeout_s (the decode side)
    MC_RPC_TIMEOUT_MS             (written)               set from --kv-tier-timeout-s

A pinned kernel skips the start-up timing and runs in every process alike: the same numerics
run after run (the test suite pins linear and chunked, `tests/conftest.py`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def home() -> Path:
    """WAVEPP_HOME: where built-in models are converted to (default ~/.cache/wavepp)."""
    return Path(os.environ.get("WAVEPP_HOME", Path.home() / ".cache" / "wavepp")).expanduser()


def linear_kernel_pin() -> str | None:
    """WAVEPP_LINEAR_KERNEL, or None: time the paths at start-up."""
    return os.environ.get("WAVEPP_LINEAR_KERNEL") or None


def attention_kernel_pin() -> str | None:
    """WAVEPP_ATTENTION_KERNEL, or None: time the kernels at start-up."""
    return os.environ.get("WAVEPP_ATTENTION_KERNEL") or None


def elementwise_kernel() -> str:
    """WAVEPP_ELEMENTWISE_KERNEL: "cpp" (default: the fused C++ passes where they build) or "torch"."""
    return "torch" if os.environ.get("WAVEPP_ELEMENTWISE_KERNEL", "cpp") == "torch" else "cpp"


def cpp_kernels_disabled() -> bool:
    """WAVEPP_NO_CPP_KERNELS set: no C++ kernel is built or loaded."""
    return bool(os.environ.get("WAVEPP_NO_CPP_KERNELS"))


def mooncake_trace(default: str) -> str:
    """WAVEPP_MOONCAKE_TRACE, or `default`."""
    return os.environ.get("WAVEPP_MOONCAKE_TRACE", default)


def quiet_transfer_engine_logs() -> None:
    """MC_LOG_LEVEL=WARNING for Mooncake's transfer engine unless set: called before it loads."""
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")


def set_transfer_progress_timeout(seconds: float) -> None:
    """MC_TCP_PROGRESS_TIMEOUT_SEC: a transfer of Mooncake's TCP transport with no progress
    for this long fails (whole seconds, at least 1); read when an engine starts, for the whole
    process."""
    os.environ["MC_TCP_PROGRESS_TIMEOUT_SEC"] = str(max(1, math.ceil(seconds)))


def set_transfer_call_deadline(seconds: float) -> None:
    """MC_TRANSFER_TIMEOUT: the most a synchronous call of Mooncake's Python engine waits
    (plus a nanosecond a byte) before it returns failed with its transfer still running; read
    when an engine is made, for the whole process."""
    os.environ["MC_TRANSFER_TIMEOUT"] = str(max(5, math.ceil(seconds)))


def set_store_rpc_timeout(seconds: float) -> None:
    """MC_RPC_TIMEOUT_MS: a Mooncake Store RPC with no answer for this long fails; read when a
    store client is set up, for the whole process."""
    os.environ["MC_RPC_TIMEOUT_MS"] = str(max(1, int(seconds * 1000)))
