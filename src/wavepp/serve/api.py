"""The endpoints' work: parse, tokenize, submit, answer (JSON or server-sent events).

A request's life here: its body read up to --max-body-bytes (else 413) -> parse (400 naming the
field; a large body on the work pool) -> its size against the limits (limits.py: prompts per
request, score items x labels, a text's characters: 400 before anything is built) -> tokenize
and check against the model (400; on the work pool, as a long text or a chat template takes a
while) -> the pipeline is
alive (else 503 naming the dead stage) -> room in the queue (else 429 with Retry-After) ->
submit every prompt (runner.py: off the event loop) -> wait for the results or the client's
disconnect, whichever comes first; a disconnect (or a cancelled handler at shutdown) aborts
every prompt of the request still in the engine, so its leases and escrow go back. A client
that leaves before its body arrived has submitted nothing: it is counted as aborted, with no
traceback in the log (a storm of them would otherwise flood it). The answer is built and
serialized on the work pool too: the event loop only moves bytes, so one large answer (echo and
20 logprobs at each of 8,000 positions) delays nobody else's.
"""

from __future__ import annotations

import time
from pathlib import Path

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from wavepp.engine import Engine, EngineError
from wavepp.openai_http import APIError, read_body
from wavepp.serve.chat import parse_cache_query, parse_chat, parse_detokenize, parse_tokenize
from wavepp.serve.completion_request import parse_completion, parse_json, parse_score
from wavepp.serve.encoding import gc_paused, json_bytes
from wavepp.serve.limits import StreamSlots, max_prompt_chars
from wavepp.serve.metrics import ServeMetrics
from wavepp.serve.responses import Responses
from wavepp.serve.runner import Runner
from wavepp.serve.scoring import score_prompts, score_response
from wavepp.serve.streaming import chat_events, completion_events

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
INLINE_PARSE_BYTES = 64 * 1024  # a larger body is parsed on the work pool, not the event loop


class API:
    def __init__(self, engine: Engine, config):
        model_name = config.model_name
        self.engine = engine
        self.config = config
        self.model_name = model_name
        self.debug = config.debug
        self.created = int(time.time())
        self.metrics = ServeMetrics(engine)
        self.runner = Runner(engine, self.metrics, config.max_waiting, config.retry_after_s)
        self.streams = StreamSlots(config.max_streams, config.retry_after_s)
        self.responses = Responses(engine, model_name)
        self._max_prompt_chars = None
        names = [model_name]
        if Path(model_name).name and Path(model_name).name != model_name:
            names.append(Path(model_name).name)
        self.model_names = tuple(names)
        self.top_k = engine.config.top_k

    def engine_info(self) -> dict:
        """What a client needs to reproduce a workload here: the pipeline's shape and policy."""
        c = self.engine.config
        return {
            "pp": c.pp,
            "policy": self.engine.policy,
            "dtype": c.dtype,
            "block_size": c.block_size,
            "vocab_size": self.engine.vocab_size,
            "stage_num_blocks": list(self.engine.stage_num_blocks),
            "debug": self.debug,
        }

    # ---- endpoints ---------------------------------------------------------------------------

    async def completions(self, request: Request):
        req = await self._parse(request, parse_completion, self.model_names, self.top_k)
        self._check_count(len(req.prompts), "prompt")
        token_lists = await self._tokenize(req.prompts, "prompt")
        # the prompt's own logprobs (vLLM's prompt_logprobs, or OpenAI's echo with logprobs):
        # every position is computed, none served from the cache
        wants_prompt = req.prompt_logprobs is not None or (req.echo and req.logprobs is not None)
        slot = self.streams.take() if req.stream else None
        try:
            submission = await self.runner.submit(
                token_lists,
                [0 if wants_prompt else None] * len(token_lists),
                req.kv_transfer,
                req.priority,
            )
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if req.stream:
            return self._stream(
                slot,
                completion_events(
                    self.runner, self.responses, request, req, token_lists, submission
                ),
            )
        results = await self.runner.results(request, submission)
        if results is None:
            return []
        return await self.runner.work(answer, self.responses.completion, req, token_lists, results)

    async def chat(self, request: Request):
        req = await self._parse(request, parse_chat, self.model_names, self.top_k)
        self._check_chars([m["content"] for m in req.messages], "messages")
        ids = await self._chat_ids(
            req.messages, req.add_generation_prompt, req.continue_final_message
        )
        slot = self.streams.take() if req.stream else None
        try:
            submission = await self.runner.submit([ids], [None], req.kv_transfer, req.priority)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if req.stream:
            return self._stream(
                slot, chat_events(self.runner, self.responses, request, req, ids, submission)
            )
        results = await self.runner.results(request, submission)
        if results is None:
            return []
        return await self.runner.work(answer, self.responses.chat, req, ids, results[0])

    async def score(self, request: Request):
        req = await self._parse(request, parse_score, self.model_names, self.engine.vocab_size)
        # every (item, label) pair is a prompt: counted before any is built
        self._check_count(
            len(req.items) * len(req.label_token_ids),
            "items",
            f"{len(req.items)} items x {len(req.label_token_ids)} labels",
        )
        query = (await self._tokenize((req.query,), "query"))[0]
        items = await self._tokenize(req.items, "items")
        prompts = await self.runner.work(
            score_prompts, query, items, req.label_token_ids, req.item_first
        )
        self._check_lengths([p.token_ids for p in prompts], "items")
        submission = await self.runner.submit(
            [p.token_ids for p in prompts], [p.logprob_start for p in prompts]
        )
        results = await self.runner.results(request, submission)
        if results is None:
            return []
        return await self.runner.work(
            answer, score_response, req, prompts, results, self.model_name
        )

    async def tokenize(self, request: Request):
        req = await self._parse(request, parse_tokenize, self.model_names)
        ids = await self._request_ids(req)
        strs = (
            await self.runner.work(self.engine.token_strs, ids) if req.return_token_strs else None
        )
        return {
            "count": len(ids),
            "max_model_len": self.engine.max_prompt_tokens,
            "tokens": ids,
            "token_strs": strs,
        }

    async def cache_query(self, request: Request):
        """How many of a prompt's tokens every stage holds now (the body as /tokenize takes
        it: a prompt, or chat messages), each stage's own count and free or evictable blocks,
        and the engine's load: what `wavepp route --routing cache` asks each replica."""
        req = await self._parse(request, parse_cache_query, self.model_names)
        if isinstance(req, list):
            ids = await self._engine_call("prompt", self.engine.tokenize, req)
        else:
            ids = await self._request_ids(req)
        if not ids:
            raise APIError(400, "the prompt is empty", "prompt")
        self._check_lengths([ids], "prompt" if isinstance(req, list) or req.prompt else "messages")
        try:
            (view,) = await self.runner.work(self.engine.cached_prefix, [ids])
        except EngineError as exc:
            raise APIError(503, str(exc), type_="service_unavailable") from None
        load = self.engine.load()
        return {
            "object": "cache_query",
            "num_tokens": view.num_tokens,
            "cached_tokens": view.cached_tokens,
            "tiers": dict(zip(("pool", "host", "store"), view.tier_tokens)),
            "stages": [
                {"cached_tokens": tokens, "available_blocks": blocks}
                for tokens, blocks in zip(view.stage_cached_tokens, view.stage_available_blocks)
            ],
            "load": {"num_waiting": load.num_waiting, "num_running": load.num_running},
        }

    async def _request_ids(self, req) -> list[int]:
        """The token ids of a /tokenize-shaped request: its chat messages or its prompt."""
        if req.messages is not None:
            self._check_chars([m["content"] for m in req.messages], "messages")
            return await self._chat_ids(
                req.messages,
                req.add_generation_prompt,
                req.continue_final_message,
                check_length=False,
            )
        self._check_chars([req.prompt], "prompt")
        if not req.prompt:
            return []
        return await self._engine_call(
            "prompt",
            self.engine.tokenize,
            req.prompt,
            add_special_tokens=req.add_special_tokens,
        )

    async def detokenize(self, request: Request):
        ids = await self._parse(request, parse_detokenize, self.model_names, self.engine.vocab_size)
        text = await self.runner.work(self.engine.decode, ids)
        if text is None:
            raise APIError(
                400, "the model has no tokenizer: token ids cannot be turned into text", "tokens"
            )
        return {"prompt": text}

    # ---- the steps of a request --------------------------------------------------------------

    async def _parse(self, request: Request, parse, *args):
        """The body read (bounded), parsed as JSON and checked by `parse(body, *args)`: on the
        event loop when small, else on the work pool (a body of millions of token ids takes
        a while to check)."""
        try:
            raw = await read_body(request, self.config.max_body_bytes)
        except ClientDisconnect:
            # nothing was submitted; the answer goes nowhere, but the handler must end quietly
            self.metrics.count("aborted")
            raise APIError(
                499,
                "the client closed the connection before its request arrived",
                type_="client_closed_request",
            ) from None
        except APIError:
            self.metrics.count("bad_request")
            raise
        if len(raw) <= INLINE_PARSE_BYTES:
            return self._counted(_parse_body, parse, raw, *args)
        return await self.runner.work(self._counted, _parse_body, parse, raw, *args)

    def _counted(self, parse, *args):
        try:
            return parse(*args)
        except APIError:
            self.metrics.count("bad_request")
            raise

    def _refuse(self, message: str, field: str | None):
        self.metrics.count("bad_request")
        raise APIError(400, message, field)

    def _check_count(self, num_prompts: int, field: str, what: str | None = None) -> None:
        """A request of more prompts than one request may hold, or than the queue takes at all
        (it could never be admitted whole: a 429 would have its client retry for ever): 400."""
        what = what or f"{num_prompts} prompts"
        limit = self.config.max_prompts_per_request
        if num_prompts > limit:
            self._refuse(
                f"{field}: {what}; this server takes at most {limit} prompts in one "
                f"request (--max-prompts-per-request)",
                field,
            )
        if num_prompts > self.runner.max_waiting:
            self._refuse(
                f"{field}: {what}; this server queues at most {self.runner.max_waiting} "
                f"prompts (--max-waiting), so the request could never be admitted",
                field,
            )

    def _check_chars(self, texts, field: str) -> None:
        """Texts whose characters alone put them past the prompt-token bound: 400, untokenized."""
        num_chars = sum(len(t) for t in texts if isinstance(t, str))
        if num_chars and num_chars > self._prompt_chars():
            self._refuse(
                f"{field} has {num_chars} characters; no text of more than "
                f"{self._prompt_chars()} fits in the {self.engine.max_prompt_tokens} "
                f"tokens a prompt may have here",
                field,
            )

    def _prompt_chars(self) -> int:
        if self._max_prompt_chars is None:
            try:
                per_token = self.engine.tokenizer.max_token_chars()
            except ValueError:  # no tokenizer: a text is refused when it is tokenized
                per_token = 2**31
            self._max_prompt_chars = max_prompt_chars(self.engine.max_prompt_tokens, per_token)
        return self._max_prompt_chars

    def _stream(self, slot, events) -> StreamingResponse:
        slot.bind(events)
        return StreamingResponse(
            _released(events, slot), media_type="text/event-stream", headers=SSE_HEADERS
        )

    async def _engine_call(self, field: str, fn, *args, **kwargs):
        """A call on the work pool whose ValueError is the client's: a 400 naming `field`."""
        try:
            return await self.runner.work(fn, *args, **kwargs)
        except ValueError as exc:
            self.metrics.count("bad_request")
            raise APIError(400, f"{field}: {exc}", field) from None

    async def _tokenize(self, prompts, field: str) -> list[list[int]]:
        """Every prompt's token ids (on the work pool); a 400 naming the first one refused."""
        for i, p in enumerate(prompts):
            self._check_chars([p], field if len(prompts) == 1 else f"{field}[{i}]")

        def tokenize_all():
            out = []
            for i, p in enumerate(prompts):
                try:
                    out.append(self.engine.tokenize(p))
                except ValueError as exc:
                    name = field if len(prompts) == 1 else f"{field}[{i}]"
                    self.metrics.count("bad_request")
                    raise APIError(400, f"{name}: {exc}", name) from None
            return out

        out = await self.runner.work(tokenize_all)
        self._check_lengths(out, field)
        return out

    async def _chat_ids(
        self,
        messages,
        add_generation_prompt: bool,
        continue_final_message: bool,
        check_length: bool = True,
    ) -> list[int]:
        ids = await self._engine_call(
            "messages",
            self.engine.apply_chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
        if check_length:
            self._check_lengths([ids], "messages")
        return ids

    def _check_lengths(self, token_lists, field: str) -> None:
        longest = self.engine.max_prompt_tokens
        for i, ids in enumerate(token_lists):
            if len(ids) > longest:
                name = field if len(token_lists) == 1 else f"{field}[{i}]"
                self.metrics.count("bad_request")
                raise APIError(
                    400,
                    f"{name} has {len(ids)} tokens; this server holds at most "
                    f"{longest} tokens per prompt (the model's positions and the "
                    f"smallest stage's cache)",
                    name,
                )


def answer(build, *args) -> Response:
    """`build(*args)` serialized to a JSON response (on the work pool: the loop only sends it),
    with the cyclic garbage collector paused (encoding.gc_paused)."""
    with gc_paused():
        return Response(json_bytes(build(*args)), media_type="application/json")


def _parse_body(parse, raw: bytes, *args):
    return parse(parse_json(raw), *args)


async def _released(events, slot):
    """The stream's events; its slot goes back however the stream ends."""
    try:
        async for event in events:
            yield event
    finally:
        slot.release()
