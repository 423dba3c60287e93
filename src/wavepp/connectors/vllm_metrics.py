"""The WavePPConnector's pulls in vLLM's own telemetry: each pull's time queued (off the step),
its pull, and its load into vLLM's cache, recorded by the worker (`PullStats`, sent to the
scheduler with each step's output, as vLLM's connector stats are) and exported on vLLM's
`/metrics` (`PullPromMetrics`):

    vllm:wavepp_kv_pull_wait_seconds    histogram  submitted to its start (0 inside the step)
    vllm:wavepp_kv_pull_seconds         histogram  every stage's part read and checked
    vllm:wavepp_kv_load_seconds         histogram  the rows written into vLLM's blocks
    vllm:wavepp_kv_pulls_total{status}  counter    "ok" or "failed" (then vLLM computes)
    vllm:wavepp_kv_pulled_bytes_total   counter

Each with vLLM's per-engine labels. Imports vLLM (it runs in vLLM's environment)."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

# pulls of a prompt's KV take milliseconds on one host, seconds on a slow link
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TIMES = (("wait_s", "pull_wait"), ("pull_s", "pull"), ("load_s", "load"))


@dataclass
class PullStats(KVConnectorStats):
    """data = {"pulls": [{"wait_s", "pull_s", "load_s", "bytes", "ok"}, ...]}: what the worker
    pulled since vLLM last took its stats."""

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data = {"pulls": []}

    def record(self, wait_s: float, pull_s: float, load_s: float, nbytes: int, ok: bool) -> None:
        self.data["pulls"].append(
            {"wait_s": wait_s, "pull_s": pull_s, "load_s": load_s, "bytes": nbytes, "ok": ok}
        )

    def is_empty(self) -> bool:
        return not self.data.get("pulls")

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        if not other.is_empty():
            self.data.setdefault("pulls", []).extend(other.data["pulls"])
        return self

    def reduce(self) -> dict[str, int | float]:
        pulls = self.data.get("pulls", [])
        if not pulls:
            return {}
        return {
            "pulls": len(pulls),
            "failed": sum(not p["ok"] for p in pulls),
            "avg_pull_wait_ms": round(fmean(p["wait_s"] for p in pulls) * 1e3, 3),
            "avg_pull_ms": round(fmean(p["pull_s"] for p in pulls) * 1e3, 3),
            "avg_load_ms": round(fmean(p["load_s"] for p in pulls) * 1e3, 3),
            "bytes": sum(p["bytes"] for p in pulls),
        }


class PullPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._times = {
            key: self._histogram_cls(
                name=f"vllm:wavepp_kv_{name}_seconds",
                documentation=f"WavePPConnector: each pull's {name.replace('_', ' ')} time.",
                buckets=list(BUCKETS_S),
                labelnames=labelnames,
            )
            for key, name in TIMES
        }
        self._pulls = self._counter_cls(
            name="vllm:wavepp_kv_pulls",
            documentation="WavePPConnector: pulls of a prompt's KV from the stages, by outcome.",
            labelnames=[*labelnames, "status"],
        )
        self._bytes = self._counter_cls(
            name="vllm:wavepp_kv_pulled_bytes",
            documentation="WavePPConnector: bytes pulled from the stages.",
            labelnames=labelnames,
        )

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        labels = self.per_engine_labelvalues[engine_idx]
        for pull in (transfer_stats_data or {}).get("pulls", []):
            for key, _ in TIMES:
                self._times[key].labels(*labels).observe(pull[key])
            self._pulls.labels(*labels, "ok" if pull["ok"] else "failed").inc()
            self._bytes.labels(*labels).inc(pull["bytes"])
