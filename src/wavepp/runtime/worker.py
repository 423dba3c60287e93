"""A stage rank other than 0: four threads.

WAVE       receives rounds-plane messages from the leader; answers them at once
           (asynchronous policies, and the outside loops trtllm-pp and sglang-pp, whose
           rank 0 waits for the answer before each microbatch) or hands them to LOOP
           (lockstep)
RECV       receives wave headers and activations from the previous stage (and the KV
           export reports of the stages before it)
QUERY      answers rank 0's cache queries (how much of a prompt this stage holds) at once,
           under the stage's lock only, beside the rounds and the waves
LOOP       runs waves in order (and, under lockstep, rounds between them), sends
           activations on, or results back to rank 0 from the last stage; passes KV
           export reports (its own writer's and those received) on the same way
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from pathlib import Path

import torch

from wavepp.runtime.channels import Channels, Shutdown
from wavepp.runtime.profile import ProfileTimes, ProfileWaves, time_stage_waves
from wavepp.runtime.protocol import (
    CacheAnswer,
    CheckIntegrity,
    ControlReply,
    ExportReport,
    LoadFailed,
    Reset,
    ResetDone,
    RoundWork,
    Setup,
    StageReady,
    WaveWork,
)
from wavepp.runtime.stage import StageRuntime
from wavepp.runtime.stage_runner import StageRunner


def run_worker(channels: Channels) -> None:
    rank = channels.rank
    setup: Setup = channels.recv_obj(0, "rounds")
    config = setup.config
    torch.set_num_threads(config.engine.num_threads)
    try:
        if (config.device, config.backend) != (channels.device.type, channels.backend):
            raise ValueError(
                f"rank 0 runs device={config.device!r} with a {config.backend} data plane, "
                f"this rank device={channels.device.type!r} with {channels.backend}: "
                f"start every rank with the same --device"
            )
        stage = StageRuntime(config, rank, channels.device)
    except Exception as exc:
        channels.send_obj(LoadFailed(rank, f"stage {rank} failed to load: {exc}"), 0, "replies")
        raise
    channels.send_obj(StageReady(rank, stage.num_blocks, stage.kernels()), 0, "replies")
    inbox: queue.Queue = queue.Queue()
    runner = StageRunner(stage, channels, config.engine.pp)
    input_width = stage.model.input_width  # hidden_size, plus DSA top-k columns where needed
    dtype = stage.model.dtype
    if stage.exporter is not None:  # each part's outcome goes to rank 0 through LOOP
        stage.exporter.on_outcome = lambda outcome: inbox.put(ExportReport((outcome,)))

    def wave_thread():
        while True:
            msg = channels.recv_obj(0, "rounds")
            if isinstance(msg, Shutdown):
                return
            if isinstance(msg, Reset):
                stage.reset(msg.policy, msg.snapshot_interval_blocks)
                channels.send_obj(ControlReply(rank, ResetDone(rank)), 0, "replies")
            elif isinstance(msg, CheckIntegrity):
                channels.send_obj(ControlReply(rank, stage.check_integrity()), 0, "replies")
            elif isinstance(msg, ProfileWaves):  # once, at start-up, before any request
                times = ProfileTimes(rank, time_stage_waves(stage, msg.shapes))
                channels.send_obj(ControlReply(rank, times), 0, "replies")
            elif runner.rounds_on_loop:
                inbox.put(RoundWork(msg))
            else:
                reply = stage.handle_round(msg)
                if reply is not None:
                    channels.send_obj(reply, 0, "replies")

    def query_thread():
        while True:
            msg = channels.recv_obj(0, "queries")
            if isinstance(msg, Shutdown):
                return
            answer = CacheAnswer(msg.query_id, rank, *stage.query(msg.items))
            channels.send_obj(answer, 0, "answers")

    def recv_thread():
        while True:
            header = channels.recv_obj(rank - 1, "headers")
            if isinstance(header, Shutdown):
                inbox.put(header)
                return
            if isinstance(header, ExportReport):  # an earlier stage's, passing through
                inbox.put(header)
                continue
            n = header.wave.num_tokens
            hidden = channels.recv_tensor((n, input_width), dtype, rank - 1) if n else None
            inbox.put(WaveWork(header, hidden))

    threads = [
        threading.Thread(target=_guard(fn, config.run_dir, rank), name=fn.__name__, daemon=True)
        for fn in (wave_thread, recv_thread, query_thread)
    ]
    for t in threads:
        t.start()
    _guard(lambda: _loop(runner, inbox), config.run_dir, rank)()
    # the leader shut WAVE and QUERY down first; RECV ended with the shutdown header
    for t in threads:
        t.join(timeout=10)
    stage.close()


def _loop(runner: StageRunner, inbox: queue.Queue) -> None:
    channels, rank, is_last = runner.channels, runner.rank, runner.is_last
    while True:
        item = inbox.get()
        if isinstance(item, Shutdown):
            if is_last:
                channels.send_obj(Shutdown(), 0, "results")
            else:
                channels.send_obj(Shutdown(), rank + 1, "headers")
            return
        if isinstance(item, RoundWork):
            t0 = time.perf_counter()
            reply = runner.stage.handle_round(item.msg)
            if reply is not None:
                channels.send_obj(reply, 0, "replies")
            runner.note_admission(time.perf_counter() - t0)
            continue
        if isinstance(item, ExportReport):  # on towards rank 0, behind the waves sent before it
            channels.send_obj(item, 0 if is_last else rank + 1, "results" if is_last else "headers")
            continue
        runner.step(item.header.wave, item.hidden, item.header.timings)


def _guard(fn, run_dir: str, rank: int):
    """Any error in a stage thread is fatal for the stage: leave a report for rank 0 (which
    names it when the process exits) and exit at once, so no peer waits on a half-dead rank."""

    def run():
        try:
            fn()
        except BaseException as exc:  # report everything, then die
            text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            if run_dir:
                Path(run_dir, f"stage{rank}.error").write_text(text)
            print(f"wavepp stage {rank}: {text}", flush=True)
            os._exit(1)

    return run
