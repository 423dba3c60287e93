"""One admission round, written once: the runtime, the simulator and the tests drive it.

    msg = next(round)                 ProbeMsg      -> every stage; their replies go back in
    msg = round.send(replies)         LeaseMsg      -> ... (lease, escrow and commit)
    msg = round.send(replies)         ReleaseMsg    -> every stage, no reply (send None back)
    ...                               StopIteration(RoundOutcome)

`round_messages` is a generator over the messages every stage must get, so the only thing a
driver supplies is the transport: a blocking exchange (runtime, tests) or events in virtual
time (simulator). Every ReleaseMsg a phase produces comes out of the generator, so a driver
cannot forget one. `run_round` is the blocking driver.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager, Generator

from wavepp.sched.admission import RoundOutcome
from wavepp.sched.messages import LeaseMsg, ProbeMsg, ReleaseMsg

RoundMsg = ProbeMsg | LeaseMsg | ReleaseMsg


def round_messages(
    leader, now: Callable[[], float], lock: ContextManager | None = None
) -> Generator[RoundMsg, list | None, RoundOutcome | None]:
    """Yield each message of one round for every stage; receive the list of replies (None
    after a ReleaseMsg). Returns the RoundOutcome, or None when nothing could start a round.
    `lock` (if any) is held around every call into the leader."""
    lock = lock or nullcontext()
    with lock:
        step = leader.start_round(now())
    if step is None:
        return None
    while True:
        if step.release is not None:
            yield step.release
        if step.outcome is not None:
            return step.outcome
        replies = yield step.send
        with lock:
            step = leader.advance_round(replies, now())


def run_round(
    leader,
    exchange: Callable[[RoundMsg], list | None],
    now: Callable[[], float],
    lock: ContextManager | None = None,
) -> RoundOutcome | None:
    """Drive one round to its end with a blocking `exchange(msg)`: send msg to every stage and
    return their replies in stage order (None for a ReleaseMsg)."""
    steps = round_messages(leader, now, lock)
    try:
        msg = next(steps)
        while True:
            msg = steps.send(exchange(msg))
    except StopIteration as stop:
        return stop.value
