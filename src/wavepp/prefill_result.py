"""What one prefilled prompt returns (`Engine.submit`'s future resolves to it)."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillResult:
    request_id: int
    num_prompt_tokens: int
    num_cached_tokens: int  # reused from the cache on every stage
    first_token_id: int | None  # None when the request failed (see error)
    first_token_logprob: float | None
    top_logprobs: tuple[tuple[int, float], ...]  # (token id, logprob), best first
    ttft_s: float | None  # arrival -> first token
    admission_s: float | None  # arrival -> admitted on every stage
    error: str | None = None
    first_token_text: str | None = None
    # with logprob_start: for each position p from logprob_start to the prompt's last but one,
    # (logprob of prompt token p + 1, ((token id, logprob), ...) top tokens at p)
    prompt_logprobs: tuple[tuple[float, tuple[tuple[int, float], ...]], ...] | None = None
    # with kv_transfer: which transfer every stage wrote its layers' KV of the prompt to
    # (kv_transfer/handoff.py);
    # "error" in it: a stage's part failed ("stage i: why"), and the transfer will not load
    kv_transfer: dict | None = None
    # where the time to the first token went, from arrival: to its first admission round
    # (queue_s), to admitted on every stage (admission_s), to its first chunk sent in a wave
    # (dispatch_s); None where it never got there
    queue_s: float | None = None
    dispatch_s: float | None = None
    priority: int = 0
    arrival_unix_s: float | None = None  # when it arrived, on the wall clock

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_cached_tokens": self.num_cached_tokens,
            "first_token_id": self.first_token_id,
            "first_token_text": self.first_token_text,
            "first_token_logprob": self.first_token_logprob,
            "top_logprobs": [[i, lp] for i, lp in self.top_logprobs],
            "ttft_s": self.ttft_s,
            "admission_s": self.admission_s,
            "queue_s": self.queue_s,
            "dispatch_s": self.dispatch_s,
            "priority": self.priority,
            "error": self.error,
            "kv_transfer": self.kv_transfer,
        }


def with_transfer_error(fut: Future, error: str) -> Future:
    """`fut`'s result with kv_transfer {"error": error} (a hand-off the store refused)."""
    out: Future = Future()
    out.request_id = fut.request_id

    def settle(done: Future) -> None:
        try:
            result = done.result()
        except BaseException as exc:
            out.set_exception(exc)
            return
        out.set_result(
            dataclasses.replace(result, kv_transfer={"error": error}) if result.ok else result
        )

    fut.add_done_callback(settle)
    return out


__all__ = ["PrefillResult", "with_transfer_error"]
