"""The last served requests' times, for GET /debug/requests: where each one's time to its
first token went (wavepp/bench/tail.py splits them into phases). Bounded: the newest
`RECENT_REQUESTS`; ServeMetrics holds one, fed as requests end, emptied at a reset."""

from __future__ import annotations

import collections

RECENT_REQUESTS = 4096  # requests GET /debug/requests keeps


class RequestLog:
    def __init__(self, maxlen: int = RECENT_REQUESTS) -> None:
        self._records: collections.deque[dict] = collections.deque(maxlen=maxlen)

    def add(self, result, answered_unix_s: float) -> None:
        """A served PrefillResult, its result having reached the HTTP layer at
        `answered_unix_s`: its arrival (unix seconds) and, from there, its first round,
        admission, first chunk sent and first token; `answer_s`: from the first token to the
        HTTP layer."""
        ttft = result.ttft_s
        arrival = result.arrival_unix_s
        answer = None
        if arrival is not None and ttft is not None:
            answer = max(0.0, answered_unix_s - arrival - ttft)
        self._records.append(
            {
                "arrival_unix_s": arrival,
                "queue_s": result.queue_s,
                "admission_s": result.admission_s,
                "dispatch_s": result.dispatch_s,
                "ttft_s": ttft,
                "answer_s": answer,
                "prompt_tokens": result.num_prompt_tokens,
                "cached_tokens": result.num_cached_tokens,
                "priority": result.priority,
            }
        )

    def records(self) -> list[dict]:
        """Oldest first."""
        return list(self._records)

    def clear(self) -> None:
        self._records.clear()
