"""The decode side's pull over Mooncake's transfer engine: tokens [start, end) of every stage's
part, straight from each stage's arena into one registered buffer of this process, then each
part's sequence number read again (ledger.py: a part freed or replaced while it was read fails
the pull, never loads).

    puller = ArenaPuller(host=None, protocol="tcp", timeout_s=10.0)
    rows = puller.pull(stages, start, end)    # {model layer: {pool: [end - start, width]}}
                                              # or PullFailed
    puller.release(stages)                    # tell each stage it may free its part (best effort)
    puller.release(stages, skip_host=err.unreachable_host)   # after a PullFailed

The rows are views of the buffer: valid until the next `pull`. A read whose peer stopped
answering fails with the engine's call still running (engine.py, PeerUnreachable): the buffer
it reads into is set aside, not reused, until that call returns. Only torch, numpy and
mooncake are imported (it runs in vLLM's environment).
"""

from __future__ import annotations

import logging

import torch

from wavepp.kv_transfer.mooncake.engine import (
    DEFAULT_TIMEOUT_S,
    PeerUnreachable,
    SetAside,
    TransferEngineHandle,
    TransferFailed,
    local_host_for,
    split_session,
)
from wavepp.kv_transfer.mooncake.part import RELEASED_OFFSET, part_bytes, read_plan

log = logging.getLogger(__name__)


class PullFailed(Exception):
    """A part that could not be pulled whole: its stage gone, its part freed, a read failed.
    `unreachable_host`: the host a read failed on (its link down, the host gone), else None."""

    def __init__(self, message: str, unreachable_host: str | None = None):
        super().__init__(message)
        self.unreachable_host = unreachable_host


class ArenaPuller:
    """`timeout_s`: a read (or a release write) that makes no progress for this long fails
    (TransferEngineHandle), and the pull with it: the decode side computes the prompt.
    `engine`: one already started (another puller's) to register this one's buffers with;
    by default the first pull starts one of its own, and `close` stops only that."""

    def __init__(
        self,
        host: str | None = None,
        protocol: str = "tcp",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        engine: TransferEngineHandle | None = None,
    ):
        self.host = host
        self.protocol = protocol
        self.timeout_s = timeout_s
        self.engine = engine
        self._owns_engine = engine is None
        self._buffer = torch.empty(0, dtype=torch.uint8)
        self._words = torch.zeros(64, dtype=torch.int64)  # seq read-backs and release words
        self._set_aside = SetAside()  # buffers a call still running may write into
        self.num_pulled_bytes = 0
        if engine is not None:
            engine.register(self._words)

    def _start(self, session: str) -> TransferEngineHandle:
        if self.engine is None:
            host = self.host or local_host_for(split_session(session)[0])
            self.engine = TransferEngineHandle.start(host, self.protocol, self.timeout_s)
            self.engine.register(self._words)
        return self.engine

    def _set_aside_buffers(self, engine: TransferEngineHandle, done) -> None:
        """A call still running may write into the buffer and the words: new ones from here
        on, those two unregistered once it returns."""
        self._set_aside.add(done, [t for t in (self._buffer, self._words) if t.numel()])
        self._buffer = torch.empty(0, dtype=torch.uint8)
        self._words = torch.zeros_like(self._words)
        engine.register(self._words)

    def _room(self, nbytes: int) -> torch.Tensor:
        if self._buffer.numel() < nbytes:
            engine = self.engine
            if self._buffer.numel():
                engine.unregister(self._buffer)
            size = max(nbytes, 2 * self._buffer.numel(), 2**24)
            self._buffer = torch.empty(size, dtype=torch.uint8)
            engine.register(self._buffer)
        return self._buffer

    def pull(self, stages: list[dict], start: int, end: int) -> dict[int, dict[str, torch.Tensor]]:
        if not stages or len(stages) > self._words.numel():
            raise PullFailed(f"{len(stages)} stages' parts cannot be pulled")
        engine = self._start(stages[0]["session"])
        self._set_aside.reclaim(engine)
        sizes = [part_bytes(loc, start, end) for loc in stages]
        buffer = self._room(sum(sizes))
        out: dict[int, dict[str, torch.Tensor]] = {}
        at = 0
        words = self._words.data_ptr()
        for i, (loc, size) in enumerate(zip(stages, sizes)):
            segments, views = read_plan(loc, start, end, buffer[at : at + size])
            at += size
            try:
                engine.read(loc["session"], segments)
                engine.read(loc["session"], [(words + 8 * i, loc["entry_addr"], 8)])
            except TransferFailed as err:
                if isinstance(err, PeerUnreachable):
                    self._set_aside_buffers(engine, err.done)
                raise PullFailed(
                    f"stage {loc['stage']}'s part: {err}", split_session(loc["session"])[0]
                ) from None
            if int(self._words[i]) != loc["seq"]:
                raise PullFailed(
                    f"stage {loc['stage']}'s part was freed before the pull ended (its TTL, or "
                    "its arena needed the room, or the stage restarted)"
                )
            for pool, (layers, rows) in views.items():
                for j, layer in enumerate(layers):
                    out.setdefault(layer, {})[pool] = rows[j]
        self.num_pulled_bytes += at
        return out

    def release(self, stages: list[dict], skip_host: str | None = None) -> None:
        """Write each part's seq into its `released` word; failures are logged (the stage's
        TTL frees what is not released). Parts on `skip_host` (one a read just failed on) are
        left to their TTL: a write there would wait out the transfer timeout again, in the
        decode step, for each of them."""
        if self.engine is None or len(stages) > self._words.numel():
            return
        words = self._words.data_ptr()
        for i, loc in enumerate(stages):
            if skip_host is not None and split_session(loc["session"])[0] == skip_host:
                continue
            self._words[i] = loc["seq"]
            try:
                self.engine.write(
                    loc["session"], words + 8 * i, loc["entry_addr"] + RELEASED_OFFSET, 8
                )
            except TransferFailed as err:
                log.info("stage %s's part could not be released: %s", loc.get("stage"), err)
                if isinstance(err, PeerUnreachable):
                    self._set_aside_buffers(self.engine, err.done)
                    words = self._words.data_ptr()

    def close(self) -> None:
        if self.engine is None:
            return
        if self._owns_engine:
            self.engine.close()
            return
        for tensor in (self._buffer, self._words):
            if tensor.numel():
                self.engine.unregister(tensor)
        self._set_aside.reclaim(self.engine)
