"""A finished request's answer: what the leader ended, as the PrefillResult its caller gets.

    answers = PrefillAnswers(core.unix_at, handoff, tokenizer, num_stages, block_size)
    result = answers(request_id, req, export_errors)   # on the core's results thread

The first token (its text where the tokenizer has it cached: never waits), its top logprobs,
the prompt's logprobs in order, the request's phases since its arrival (queue, dispatch, TTFT,
admission) and, for a request that exported its KV, the hand-off's answer (`KVHandoff.answer`).
A request that failed or was aborted gets its error, and its export is dropped.
"""

from __future__ import annotations

from typing import Callable

from wavepp.kv_transfer.handoff import KVHandoff
from wavepp.prefill_result import PrefillResult
from wavepp.sched import RequestState
from wavepp.tokenizer import Tokenizer


class PrefillAnswers:
    def __init__(
        self,
        unix_at: Callable[[float], float],
        handoff: KVHandoff | None,
        tokenizer: Tokenizer,
        num_stages: int,
        block_size: int,
    ) -> None:
        self._unix_at = unix_at  # the core's clock to Unix time
        self._handoff = handoff
        self._tokenizer = tokenizer
        self._layout = {"num_stages": num_stages, "block_size": block_size}

    def __call__(
        self, request_id: int, req, export_errors: dict[int, str] | None = None
    ) -> PrefillResult:
        def since_arrival(t: float | None) -> float | None:
            return None if t is None else t - req.arrival_time

        ttft, adm = since_arrival(req.finish_time), since_arrival(req.admitted_time)
        phases = {
            "queue_s": since_arrival(req.round_time),
            "dispatch_s": since_arrival(req.dispatch_time),
            "priority": req.priority,
            "arrival_unix_s": self._unix_at(req.arrival_time),
        }
        token = req.result
        if req.state != RequestState.DONE or token is None:
            if req.export_id is not None and self._handoff is not None:
                self._handoff.drop_own(req.export_id)
            return PrefillResult(
                request_id,
                req.num_tokens,
                0,
                None,
                None,
                (),
                ttft,
                adm,
                error=req.failure or req.state.value,
                **phases,
            )
        text = self._tokenizer.token_text_if_loaded(token.token_id)  # cached: never waits
        prompt_logprobs = None
        if req.logprob_start is not None:
            prompt_logprobs = tuple(
                (lp, tuple(zip(ids, lps)))
                for part in sorted(req.prompt_logprobs, key=lambda p: p.start)
                for lp, ids, lps in zip(part.logprobs, part.top_ids, part.top_logprobs)
            )
        transfer = None
        if req.export_id is not None and self._handoff is not None:
            transfer = self._handoff.answer(
                req.export_id, req.num_tokens, dict(self._layout), export_errors
            )
        return PrefillResult(
            request_id,
            req.num_tokens,
            req.num_cached_tokens,
            token.token_id,
            token.logprob,
            tuple(zip(token.top_ids, token.top_logprobs)),
            ttft,
            adm,
            first_token_text=text,
            prompt_logprobs=prompt_logprobs,
            kv_transfer=transfer,
            **phases,
        )
