"""C++ CPU kernels, compiled on first use: the attention softmax (`csrc/cpu_softmax.cpp`) and
the fused elementwise passes of a layer (`csrc/cpu_elementwise.cpp`: SiLU-and-mul, RMSNorm,
RoPE).

torch's softmax on a CPU is bound by its `exp` (0.46-0.6 ns per score on a Zen 4 core); the
kernel here computes exp with a short polynomial the compiler vectorizes, and applies the
causal mask inside instead of adding a bias tile first. The elementwise kernels read and write
each tensor once where torch's ops make a pass per op, and round where those ops round.

Each extension is built once per machine with `torch.utils.cpp_extension.load_inline` (g++ and
ninja) into torch's extensions directory (`TORCH_EXTENSIONS_DIR`, default
~/.cache/torch_extensions), under a name that hashes the source, the flags and this CPU, so a
copy of that directory on another CPU builds its own. Later processes load the built module
in well under a second. Without a compiler, or when the build fails, `softmax_kernels()` /
`elementwise_kernels()` is None and the callers keep torch's ops; one log line says why.
`WAVEPP_NO_CPP_KERNELS=1` turns both off (`wavepp/env.py`). Whether a stage runs the
elementwise ones is its `Kernels.elementwise` (`kernels/choice.py`), not state here.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
import time
from importlib import resources

import torch

from wavepp import env

log = logging.getLogger(__name__)

_FLAGS = ("-O3", "-march=native", "-fopenmp-simd")
STALE_LOCK_S = 600.0  # a build lock older than this was left by a builder that died
_lock = threading.Lock()
_modules: dict[str, object] = {}  # source file -> its built module, or None where it failed


def softmax_kernels():
    """The compiled softmax module (functions `softmax_` and `softmax_unnormalized_`), or None
    where it cannot be built. Builds it on the first call in this process (once per machine;
    the build time is logged); later calls return the same module."""
    return _get("cpu_softmax.cpp", "C++ softmax", "torch's softmax")


def elementwise_kernels():
    """The compiled elementwise module (`silu_mul`, `rms_norm`, `rotary`; bf16), or None where
    it cannot be built. Built like `softmax_kernels()`."""
    return _get("cpu_elementwise.cpp", "C++ elementwise kernels", "torch's ops")


def amx_attention_kernels():
    """The compiled AMX attention module (`available()`, `attention(...)`;
    `csrc/cpu_attention_amx.cpp`), or None where it cannot be built or this CPU and kernel
    give no AMX tiles (`available()` false). Built like `softmax_kernels()`."""
    module = _get("cpu_attention_amx.cpp", "AMX attention kernel", "the other attention kernels")
    return module if module is not None and module.available() else None


def _get(source_name: str, label: str, fallback: str):
    with _lock:
        if source_name not in _modules:
            _modules[source_name] = _build(source_name, label, fallback)
        return _modules[source_name]


def softmax_(scores: torch.Tensor, causal_rows: int = 0, *, vectorized: bool = True) -> None:
    """Row softmax of `scores` ([..., L], contiguous, fp32 or bf16, on the CPU) in place.

    causal_rows = n > 0: the rows come in blocks of n query rows, the last of which sees every
    key; row i of a block (i = row index % n) sees keys [0, L - n + i], the rest of its row
    becomes 0 (the additive causal bias of a chunk's tile, without the bias tensor). n = 0:
    every key is seen. vectorized=False runs the portable loops where the AVX-512 ones are
    built (for tests). Requires `softmax_kernels()` to be a module."""
    _modules["cpu_softmax.cpp"].softmax_(scores, causal_rows, vectorized)


def softmax_unnormalized_(
    scores: torch.Tensor,
    causal_rows: int,
    row_max: torch.Tensor,
    row_sum: torch.Tensor,
    *,
    vectorized: bool = True,
) -> None:
    """exp(s - m) in place of `scores`, m each row's max over the keys it sees (causal_rows as
    in `softmax_`); writes m and the row's sum of the stored exps (fp32) into row_max, row_sum:
    [H, R] fp32 views (any strides) with H * R = the number of score rows."""
    _modules["cpu_softmax.cpp"].softmax_unnormalized_(
        scores, causal_rows, row_max, row_sum, vectorized
    )


def _build(source_name: str, label: str, fallback: str):
    if env.cpp_kernels_disabled():
        log.info("C++ CPU kernels off (WAVEPP_NO_CPP_KERNELS); %s run", fallback)
        return None
    start = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load_inline

        source = resources.files("wavepp.models.kernels").joinpath("csrc", source_name).read_text()
        name = f"wavepp_{source_name.removesuffix('.cpp')}_{_fingerprint(source)}"
        clear_stale_lock(name)
        built = _is_built(name)
        module = load_inline(name, cpp_sources=[source], extra_cflags=list(_FLAGS), verbose=False)
    except Exception as err:  # no compiler, a failed build: keep torch's path
        lines = str(err).strip().splitlines() or [""]
        log.warning(
            "%s unavailable (%s: %s); %s run", label, type(err).__name__, lines[-1][:200], fallback
        )
        return None
    seconds = time.perf_counter() - start
    if built:
        log.info("%s loaded in %.2f s", label, seconds)
    else:  # the first use on this machine: say what it cost (visible without logging set up)
        log.warning(
            "%s built in %.1f s (g++ %s; once per machine)", label, seconds, " ".join(_FLAGS)
        )
    return module


def clear_stale_lock(name: str, stale_after_s: float = STALE_LOCK_S) -> bool:
    """Remove the build lock of `name` if it is older than `stale_after_s`: torch's builder
    takes a lock file in the build directory and every other process waits for it to go,
    forever if the builder was killed mid-build (no build here takes minutes). Returns whether
    one was removed (and says so in the log)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        lock = os.path.join(_get_build_directory(name, False), "lock")
        age = time.time() - os.path.getmtime(lock)
    except Exception:  # no lock (the usual case), or torch's private helper moved
        return False
    if age < stale_after_s:
        return False
    try:
        os.remove(lock)
    except OSError:
        return False
    log.warning("removed %s, left %.0f s ago by a build that did not finish", lock, age)
    return True


def _is_built(name: str) -> bool:
    """Whether torch's extensions directory holds `name` already (only for the log line)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return os.path.exists(os.path.join(_get_build_directory(name, False), f"{name}.so"))
    except Exception:  # a private helper of torch's; say "built" then
        return False


def _fingerprint(source: str) -> str:
    """Source, flags, torch and this CPU: -march=native code runs only where it was built."""
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu += "".join(
                sorted({line for line in info if line.startswith(("model name", "flags"))})
            )
    except OSError:
        pass
    text = "\n".join((source, " ".join(_FLAGS), torch.__version__, cpu))
    return hashlib.sha256(text.encode()).hexdigest()[:12]
