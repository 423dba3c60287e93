"""The router's options (`wavepp route`'s flags), checked where they are born."""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.openai_http import DEFAULT_MAX_BODY_BYTES
from wavepp.route.replica_table import POLICIES


@dataclass(frozen=True)
class RouteConfig:
    """`prefill` and `decode`: one URL, a comma-separated list, or a sequence of them (decode
    may be empty: no decode step); held as tuples of URLs without a trailing slash. `routing`:
    one of replica_table.py's POLICIES (default cache)."""

    prefill: tuple[str, ...] | str
    decode: tuple[str, ...] | str = ()
    timeout_s: float = 600.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    routing: str = "cache"
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0  # a health check unanswered this long fails
    query_timeout_s: float = 1.0  # the cache policy's question: past it, the replica holds 0
    drop_timeout_s: float = 5.0  # a transfer's drop at the prefill; past it, the TTL frees it

    def __post_init__(self) -> None:
        for name in ("prefill", "decode"):
            object.__setattr__(self, name, _urls(name, getattr(self, name)))
        if not self.prefill:
            raise ValueError("at least one prefill server is needed")
        if self.routing not in POLICIES:
            raise ValueError(f"routing must be one of {', '.join(POLICIES)}, got {self.routing!r}")
        if not self.health_interval_s > 0:
            raise ValueError(f"the health interval must be positive, got {self.health_interval_s}")
        for name in ("timeout_s", "health_timeout_s", "query_timeout_s", "drop_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)} s")
        if self.max_body_bytes < 1:
            raise ValueError(f"the body limit must be >= 1 byte, got {self.max_body_bytes}")


def _urls(name: str, value) -> tuple[str, ...]:
    urls = value.split(",") if isinstance(value, str) else list(value or ())
    urls = tuple(u.strip().rstrip("/") for u in urls if u.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"a {name} server must be an http(s) URL, got {url!r}")
    return urls
