"""The KV hand-off's transports, by name: the one registry that the options' checks, the stages
and rank 0's hand-off ask, instead of comparing names.

    | name        | needs_store | takes_host | stage side (StageWriter) | rank 0 (HandoffBackend) |
    |-------------|-------------|------------|--------------------------|-------------------------|
    | "directory" | yes         | no         | DirectoryWriter          | DirectoryBackend        |
    | "mooncake"  | no          | yes        | ArenaWriter              | ArenaBackend            |

`needs_store`: it writes into a directory (`kv_store`), which the options must name; a transport
without one takes none. `takes_host`: its stages listen on an address (`kv_host`), checked where
the options are built. How a transport's usage is reported is its backend's `HandoffUsage`
(usage.py). The factories import their transport on first use: this module imports no torch,
so the options are checked without it.

    transport = get_transport("mooncake")        # ValueError naming the transports there are
    writer = transport.stage_writer(config, stage_id)   # config: a RuntimeConfig
    backend = transport.backend(root, num_stages=2, max_bytes=None, ttl_s=600.0, clock=clock)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from wavepp.kv_transfer.interfaces import HandoffBackend, StageWriter


@dataclass(frozen=True)
class Transport:
    name: str
    needs_store: bool  # writes into a directory: kv_store is required, and taken by no other
    takes_host: bool  # its stages listen on kv_host
    stage_writer: Callable[..., StageWriter]  # (RuntimeConfig, stage_id) -> a stage's writer
    backend: Callable[..., HandoffBackend]  # (root, *, num_stages, max_bytes, ttl_s, clock)
    check_installed: Callable[[], None]  # RuntimeError naming what to install, before a spawn


def get_transport(name: str) -> Transport:
    """The transport `name` names; ValueError naming the ones there are."""
    try:
        return TRANSPORTS[name]
    except (KeyError, TypeError):
        raise ValueError(f"kv transport must be {transport_names()}, got {name!r}") from None


def transport_names() -> str:
    """ "'directory' or 'mooncake'": for messages."""
    return " or ".join(repr(name) for name in TRANSPORTS)


def _directory_writer(config, stage_id: int) -> StageWriter:
    from wavepp.kv_transfer.directory.store import DirectoryStore
    from wavepp.kv_transfer.directory.writer import DirectoryWriter

    return DirectoryWriter(DirectoryStore(config.kv_store))


def _directory_backend(root, *, num_stages, max_bytes, ttl_s, clock=time.monotonic):
    from wavepp.kv_transfer.directory.backend import DirectoryBackend

    if root is None:
        raise ValueError("the directory KV transport needs a directory (kv_store)")
    return DirectoryBackend(root, max_bytes=max_bytes, ttl_s=ttl_s)


def _arena_writer(config, stage_id: int) -> StageWriter:
    from wavepp.kv_transfer.mooncake.engine import default_host
    from wavepp.kv_transfer.mooncake.writer import ArenaWriter

    opts = config.engine  # the EngineConfig inside the RuntimeConfig
    return ArenaWriter(
        stage_id,
        host=opts.kv_host or default_host(),
        protocol=opts.kv_transport_protocol,
        arena_bytes=int(opts.kv_arena_gib * 2**30),
        ttl_s=opts.kv_ttl_s,
        timeout_s=opts.kv_transfer_timeout_s,
    )


def _arena_backend(root, *, num_stages, max_bytes, ttl_s, clock=time.monotonic):
    from wavepp.kv_transfer.mooncake.backend import ArenaBackend

    return ArenaBackend(num_stages=num_stages, ttl_s=ttl_s, clock=clock)


def _nothing_to_install() -> None:
    return


def _check_mooncake_installed() -> None:
    from wavepp.kv_transfer.mooncake.engine import check_installed

    check_installed()


TRANSPORTS: dict[str, Transport] = {
    t.name: t
    for t in (
        Transport(
            "directory",
            needs_store=True,
            takes_host=False,
            stage_writer=_directory_writer,
            backend=_directory_backend,
            check_installed=_nothing_to_install,
        ),
        Transport(
            "mooncake",
            needs_store=False,
            takes_host=True,
            stage_writer=_arena_writer,
            backend=_arena_backend,
            check_installed=_check_mooncake_installed,
        ),
    )
}
