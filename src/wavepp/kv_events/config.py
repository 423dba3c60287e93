"""The options of KV cache events: the JSON `wavepp serve --kv-events-config` takes, with the
fields, defaults and meaning of vLLM's option of the same name, so that one deployment file
configures either engine.

    enable_kv_cache_events  false          nothing is published unless true
    publisher               "zmq" if enabled, else "null" ("null": recorded, never sent)
    endpoint                "tcp://*:5557"  the PUB socket: bound when it holds `*` (or is an
                                           ipc:// / inproc:// address), else connected
    replay_endpoint         null           a ROUTER socket (always bound) that resends the
                                           batches still buffered from a sequence number on
    buffer_steps            10000          batches kept for replay
    hwm                     100000         ZeroMQ's high-water mark of the PUB socket
    max_queue_size          100000         batches waiting for the publisher thread; beyond
                                           it new ones are dropped (and counted)
    topic                   ""             the first frame of every message

Torch-free and thread-free: the command line checks it before anything starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

PUBLISHERS = ("null", "zmq")


@dataclass(frozen=True)
class KVEventsConfig:
    """See the module docstring; a bad field raises ValueError naming it."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None  # None: "zmq" when enabled, else "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ValueError(
                f"enable_kv_cache_events must be true or false, got {self.enable_kv_cache_events!r}"
            )
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        if self.publisher not in PUBLISHERS:
            raise ValueError(f"publisher must be 'zmq' or 'null', got {self.publisher!r}")
        for name in ("endpoint", "topic"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        if self.replay_endpoint is not None and not isinstance(self.replay_endpoint, str):
            raise ValueError(f"replay_endpoint must be a string, got {self.replay_endpoint!r}")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(
                    f"{name} must be a ZeroMQ address (tcp://HOST:PORT, ipc://PATH or "
                    f"inproc://NAME), got {value!r}"
                )
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def publishes(self) -> bool:
        """Whether batches go out on a socket (enabled, and the publisher is "zmq")."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @staticmethod
    def from_json(text: str) -> KVEventsConfig:
        """The config of a JSON object with vLLM's field names; ValueError names what is
        wrong (not JSON, not an object, an unknown field, a bad value)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(data, dict):
            raise ValueError(f"must be a JSON object, got {type(data).__name__}")
        known = [f.name for f in fields(KVEventsConfig)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(
                f"unknown field(s) {', '.join(map(repr, unknown))}; the fields are "
                f"{', '.join(known)}"
            )
        return KVEventsConfig(**data)
