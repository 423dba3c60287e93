"""Waiting in a test for what another thread or process does."""

from __future__ import annotations

import time


def eventually(cond, timeout_s: float = 10.0, poll_s: float = 0.01) -> bool:
    """True once `cond()` holds (asked every `poll_s`), False if `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
