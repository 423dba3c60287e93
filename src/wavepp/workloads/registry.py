"""Named workloads with defaults sized for a CPU run: `make_workload("reuse", prompt_len=512)`."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from wavepp import env
from wavepp.workloads.synthetic import cold, gsp, mixed, reuse, short_suffix
from wavepp.workloads.trace import trace
from wavepp.workloads.workload import Workload

# The published Mooncake trace in the shared/ folder beside the checkout (src/wavepp/workloads ->
# repository root -> ../shared); WAVEPP_MOONCAKE_TRACE overrides.
DEFAULT_MOONCAKE_TRACE = str(
    Path(__file__).resolve().parents[3].parent
    / "shared"
    / "data"
    / "mooncake"
    / "synthetic_trace.jsonl"
)


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    factory: Callable[..., Workload]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def make(self, **overrides) -> Workload:
        accepted = set(inspect.signature(self.factory).parameters)
        unknown = sorted(set(overrides) - accepted)
        if unknown:
            raise ValueError(
                f"workload {self.name!r} has no parameter(s) {', '.join(unknown)}; "
                f"it takes {', '.join(sorted(accepted))}"
            )
        return self.factory(**{**self.defaults, **overrides})


def _mooncake(path: str | None = None, **kwargs) -> Workload:
    return trace(path or env.mooncake_trace(DEFAULT_MOONCAKE_TRACE), **kwargs)


_mooncake.__signature__ = inspect.signature(trace)  # so overrides are checked against trace()

WORKLOADS: dict[str, WorkloadSpec] = {
    s.name: s
    for s in (
        WorkloadSpec(
            "cold",
            cold,
            {"num_requests": 64, "prompt_len": 2048},
            "independent prompts, nothing to reuse",
        ),
        WorkloadSpec(
            "reuse",
            reuse,
            {"num_requests": 64, "num_groups": 8, "prompt_len": 2048, "reuse_ratio": 0.9},
            "groups sharing 90% of each prompt",
        ),
        WorkloadSpec(
            "short_suffix",
            short_suffix,
            {"num_requests": 64, "num_groups": 8, "prefix_len": 1536, "suffix_len": 64},
            "long shared prefix, short suffix (the admission-bound case)",
        ),
        WorkloadSpec(
            "mixed",
            mixed,
            {
                "num_requests": 64,
                "num_groups": 8,
                "prompt_len": 2048,
                "reuse_ratio": 0.9,
                "warm_fraction": 0.75,
            },
            "75% warm (90% reuse), 25% cold, interleaved",
        ),
        WorkloadSpec(
            "gsp",
            gsp,
            {
                "num_groups": 64,
                "prompts_per_group": 16,
                "system_prompt_len": 2048,
                "question_len": 128,
            },
            "SGLang generated-shared-prefix",
        ),
        WorkloadSpec(
            "mooncake",
            _mooncake,
            {"tokens_per_block": 32, "max_requests": 256},
            "Mooncake FAST'25 synthetic trace, open loop, 512-token blocks scaled",
        ),
    )
}


def make_workload(name: str, **overrides) -> Workload:
    """Build a registered workload; `overrides` replace its defaults ('-' and '_' are alike)."""
    key = name.replace("-", "_")
    if key not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return WORKLOADS[key].make(**overrides)


@dataclass(frozen=True)
class WorkloadOptions:
    """What `wavepp bench` and `wavepp simulate` say about a workload, with one meaning in
    both: lengths in tokens (the simulator passes them already scaled to its tokens)."""

    num_requests: int
    prompt_len: int  # cold, reuse, mixed: the whole prompt
    prefix_len: int  # short-suffix: the shared prefix; gsp: the system prompt
    suffix_len: int  # short-suffix: each suffix; gsp: each question
    num_groups: int = 8
    reuse_ratio: float = 0.9  # reuse, mixed
    tokens_per_block: int = 32  # trace: tokens that stand for one of its 512-token blocks
    max_trace_requests: int = 256
    trace_file: str | None = None
    time_scale: float = 1.0  # trace: arrival time multiplier
    common: Mapping[str, Any] = field(default_factory=dict)  # vocab_size, seed, block_size


WORKLOAD_NAMES = ("cold", "reuse", "short-suffix", "mixed", "gsp", "trace")


def workload_from_options(name: str, opts: WorkloadOptions) -> Workload:
    """The workload `name` (one of WORKLOAD_NAMES; '-' and '_' alike, "mooncake" = "trace")
    built from the command line's options."""
    kind = name.replace("_", "-")
    n, c = opts.num_requests, dict(opts.common)
    if kind in ("trace", "mooncake"):
        extra = {"path": opts.trace_file} if opts.trace_file else {}
        return make_workload(
            "mooncake",
            tokens_per_block=opts.tokens_per_block,
            max_requests=opts.max_trace_requests,
            time_scale=opts.time_scale,
            **extra,
            **c,
        )
    if kind == "cold":
        return make_workload("cold", num_requests=n, prompt_len=opts.prompt_len, **c)
    if kind == "short-suffix":
        return make_workload(
            "short_suffix",
            num_requests=n,
            num_groups=opts.num_groups,
            prefix_len=opts.prefix_len,
            suffix_len=opts.suffix_len,
            **c,
        )
    if kind in ("reuse", "mixed"):
        return make_workload(
            kind,
            num_requests=n,
            num_groups=opts.num_groups,
            prompt_len=opts.prompt_len,
            reuse_ratio=opts.reuse_ratio,
            **c,
        )
    if kind == "gsp":
        groups = max(1, n // 16)
        return make_workload(
            "gsp",
            num_groups=groups,
            prompts_per_group=max(1, n // groups),
            system_prompt_len=opts.prefix_len,
            question_len=opts.suffix_len,
            **c,
        )
    raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOAD_NAMES)}")
