"""The server's bounds on one request, and the two mechanisms that enforce them before any work
is done: a body read that stops at the byte limit (`read_body`, in wavepp/openai_http.py: the
router reads its bodies the same way), and the slots of open streams.

    what                      option                       default          beyond it
    body bytes                --max-body-bytes             32 MiB           413
    prompts in one request    --max-prompts-per-request    256 (and at      400: it could never
      (score: items x labels)                              most --max-waiting)  be queued whole
    prompt tokens             the model's positions and the smallest stage's cache   400
    prompt characters         prompt tokens x the longest token string x 4           400, before
                                                                                     tokenizing
    logprobs, top_logprobs,   --top-k                      20               400
      prompt_logprobs
    open streams              --max-streams                256              429, Retry-After
    prompts waiting           --max-waiting                256              429, Retry-After

A text of n characters has at least n / (longest token string) tokens, so a text past the
character bound cannot fit in the prompt-token bound whatever it says: it is refused without
being tokenized (the factor 4 leaves room for a normalizer that joins characters, as NFC does).
docs/serving.md has the same table for users.
"""

from __future__ import annotations

import threading
import weakref

from wavepp.openai_http import APIError

DEFAULT_MAX_PROMPTS_PER_REQUEST = 256
DEFAULT_MAX_STREAMS = 256
# a normalizer may join characters (NFC: a letter and its combining accent become one), so a
# text may shrink before it is tokenized; none shrinks it 4 times over
NORMALIZATION_SLACK = 4


def max_prompt_chars(max_prompt_tokens: int, max_token_chars: int) -> int:
    """The most characters a text prompt may have before it is refused untokenized."""
    return max_prompt_tokens * max_token_chars * NORMALIZATION_SLACK


class StreamSlots:
    """At most `limit` server-sent-event streams open at once. `take` raises 429 when none is
    free; the slot it returns is given back by `release` (idempotent), or when the stream's
    generator is collected without ever having run (a client gone before the first event)."""

    def __init__(self, limit: int, retry_after_s: int):
        self.limit = limit
        self.retry_after_s = retry_after_s
        self._open = 0
        self._lock = threading.Lock()

    @property
    def num_open(self) -> int:
        return self._open

    def take(self) -> "StreamSlot":
        with self._lock:
            if self._open >= self.limit:
                raise APIError(
                    429,
                    f"too many open streams ({self.limit}); retry later",
                    type_="rate_limit_error",
                    headers={"Retry-After": str(self.retry_after_s)},
                )
            self._open += 1
        return StreamSlot(self)

    def give_back(self) -> None:
        with self._lock:
            self._open -= 1


class StreamSlot:
    def __init__(self, slots: StreamSlots):
        self._slots = slots
        self._held = True
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._slots.give_back()

    def bind(self, stream) -> None:
        """Release the slot when `stream` (an async generator) is collected, if not before."""
        weakref.finalize(stream, self.release)
