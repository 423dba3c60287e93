"""Server-sent events for `"stream": true`, as OpenAI and vLLM send them:

    completions   one chunk per prompt as its first token arrives (text, logprobs,
                  finish_reason "length", prompt_logprobs when asked), in the order they finish
    chat          a chunk opening the assistant's turn (delta.role), then one with the token
                  (delta.content, logprobs, finish_reason)
    then          a chunk with the usage and no choices, with stream_options.include_usage
                  data: [DONE]

A prompt that fails once the stream has begun (status 200 already sent) ends it with an error
event, {"error": {...}} as vLLM sends one, then [DONE]. A client that closes the connection
aborts every prompt of its request still in the engine, as the non-streaming path does:
whether the loop below sees the disconnect first or the server cancels the stream, the
`finally` aborts what has not ended.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import AsyncIterator

from starlette.requests import Request

from wavepp.openai_http import APIError
from wavepp.serve.chat import ChatRequest
from wavepp.serve.completion_request import CompletionRequest
from wavepp.serve.encoding import gc_paused, json_bytes
from wavepp.serve.responses import Responses, new_id, usage
from wavepp.serve.runner import Runner, Submission, disconnected, raise_if_failed

DONE = "data: [DONE]\n\n"


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def completion_events(
    runner: Runner,
    responses: Responses,
    request: Request,
    req: CompletionRequest,
    token_lists,
    submission: Submission,
) -> AsyncIterator[str]:
    head = {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": responses.model_name,
    }
    results = [None] * len(token_lists)

    async def events():
        async for index, result in _as_finished(request, submission):
            results[index] = result
            # built on the work pool: with echo and logprobs it decodes every prompt token
            yield await runner.work(_chunk, responses, head, req, index, token_lists[index], result)
        if req.include_usage:
            yield sse({**head, "choices": [], "usage": usage(token_lists, results, req.max_tokens)})

    return _ended(events(), runner, submission)


def chat_events(
    runner: Runner,
    responses: Responses,
    request: Request,
    req: ChatRequest,
    ids: list[int],
    submission: Submission,
) -> AsyncIterator[str]:
    head = {
        "id": new_id("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": responses.model_name,
    }

    async def events():
        async for _, result in _as_finished(request, submission):
            yield sse(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
            content = responses.first_text(result) if req.max_tokens == 1 else ""
            yield sse(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": content},
                            "logprobs": responses.chat_logprobs(req, result),
                            "finish_reason": "length",
                            "stop_reason": None,
                        }
                    ],
                }
            )
            if req.include_usage:
                yield sse({**head, "choices": [], "usage": usage([ids], [result], req.max_tokens)})

    return _ended(events(), runner, submission)


def _chunk(
    responses: Responses, head: dict, req: CompletionRequest, index: int, ids, result
) -> str:
    """One prompt's event, built and serialized (on the work pool, the collector paused)."""
    with gc_paused():
        choice = responses.completion_choice(req, index, req.prompts[index], ids, result)
        return f"data: {json_bytes({**head, 'choices': [choice]}).decode()}\n\n"


async def _ended(
    events: AsyncIterator[str], runner: Runner, submission: Submission
) -> AsyncIterator[str]:
    """A stream's events, then [DONE]; an APIError on the way becomes its error event and
    [DONE]. However the stream ends (done, failed, the client gone), the submission's prompts
    still running are aborted and `events` is closed."""
    try:
        async for event in events:
            yield event
        yield DONE
    except APIError as exc:
        yield sse(exc.body())
        yield DONE
    finally:
        runner.abort(submission)
        await events.aclose()


async def _as_finished(request: Request, submission: Submission):
    """(prompt index, PrefillResult) as each prompt ends; stops quietly if the client left.
    A prompt that failed raises APIError."""
    pending = {f: i for i, f in enumerate(submission.futures)}
    while pending:
        gone = asyncio.ensure_future(disconnected(request))
        try:
            done, _ = await asyncio.wait({*pending, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        finished = [f for f in done if f is not gone]
        if not finished:
            return  # the client left: the caller's finally aborts the rest
        for f in sorted(finished, key=pending.get):
            index = pending.pop(f)
            result = f.exception() or f.result()
            raise_if_failed(result)
            yield index, result
