"""Rank 0's end of the rounds plane: one message to every stage, stage 0 answering in place.

    rank 0                          ranks 1 .. P-1 (worker.py, their WAVE thread)
      send  msg  --- "rounds" --->    handle it
      stage 0 handles it here         ...
      recv  replies <-- "replies" --  answer (in rank order)

Stage 0's answer is computed while the other ranks compute theirs. Every call blocks until
each rank it waits on answered; a lost rank raises PeerLostError (channels.py). The start-up
uses the same two planes (`start_stages`: Setup out, StageReady or LoadFailed back).
"""

from __future__ import annotations

import torch

from wavepp.runtime.channels import Channels
from wavepp.runtime.config import RuntimeConfig
from wavepp.runtime.protocol import EngineError, LoadFailed, Setup
from wavepp.runtime.stage import StageRuntime
from wavepp.sched import ReleaseMsg


def start_stages(
    config: RuntimeConfig, channels: Channels
) -> tuple[StageRuntime, tuple[int, ...], tuple[str, ...]]:
    """Send every other rank its Setup, load stage 0 here meanwhile, then take each rank's
    StageReady: (stage 0, every stage's blocks, every stage's kernel paths, "" for rank 0's,
    which it reads live). A rank that could not load raises EngineError naming why."""
    for rank in range(1, config.engine.pp):
        channels.send_obj(Setup(config), rank, "rounds")
    torch.set_num_threads(config.engine.num_threads)
    stage = StageRuntime(config, 0, channels.device)
    blocks, kernels = [stage.num_blocks], [""]
    for rank in range(1, config.engine.pp):
        msg = channels.recv_obj(rank, "replies")
        if isinstance(msg, LoadFailed):
            raise EngineError(msg.reason)
        blocks.append(msg.num_blocks)
        kernels.append(msg.kernels)
    return stage, tuple(blocks), tuple(kernels)


class RoundsPlane:
    def __init__(self, channels: Channels, stage: StageRuntime, num_stages: int):
        self.channels = channels
        self.stage = stage
        self.num_stages = num_stages

    def tell_workers(self, msg) -> None:
        """Send `msg` to every rank but 0; no answer is awaited."""
        for rank in range(1, self.num_stages):
            self.channels.send_obj(msg, rank, "rounds")

    def ask_workers(self, msg) -> list:
        """Send `msg` to every rank but 0: their replies, rank 1 first."""
        self.tell_workers(msg)
        return [self.channels.recv_obj(rank, "replies") for rank in range(1, self.num_stages)]

    def broadcast(self, msg) -> list:
        """A round message to every stage (stage 0 here): the replies in stage order."""
        self.tell_workers(msg)
        replies = [self.stage.handle_round(msg)]
        replies += [self.channels.recv_obj(rank, "replies") for rank in range(1, self.num_stages)]
        return replies

    def exchange(self, msg) -> list | None:
        """The round driver's transport (sched/rounds.py): a release goes to every stage with
        no reply (None); a message with nothing to ask gets the empty answers without being
        sent; any other is broadcast."""
        if isinstance(msg, ReleaseMsg):
            self.tell_workers(msg)
            self.stage.handle_round(msg)
            return None
        if not len(msg):
            return [msg.empty_reply(s) for s in range(self.num_stages)]
        return self.broadcast(msg)
