"""The endpoints' work: parse, tokenize, submit, answer (JSON or server-sent events).

A request's life here: parse (400 naming the field) -> tokenize and check against the model
(400; on the engine pool, as a long text or a chat template takes a while) -> the pipeline is
alive (else 503 naming the dead stage) -> room in the queue (else 429 with Retry-After) ->
submit every prompt (runner.py: off the event loop) -> wait for the results or the client's
disconnect, whichever comes first; a disconnect (or a cancelled handler at shutdown) aborts
every prompt of the request still in the engine, so its leases and escrow go back. A client
that leaves before its body arrived has submitted nothing: it is counted as aborted, with no
traceback in the log (a storm of them would otherwise flood it).
"""

from __future__ import annotations

import time
from pathlib import Path

from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse

from wavepp.engine import Engine
from wavepp.serve.chat import parse_chat, parse_detokenize, parse_tokenize
from wavepp.serve.errors import APIError
from wavepp.serve.metrics import ServeMetrics
from wavepp.serve.protocol import parse_completion, parse_json, parse_score
from wavepp.serve.responses import Responses
from wavepp.serve.runner import Runner
from wavepp.serve.scoring import score_prompts, score_response
from wavepp.serve.streaming import chat_events, completion_events

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class API:
    def __init__(self, engine: Engine, model_name: str, max_waiting: int, retry_after_s: int, debug: bool):
        self.engine = engine
        self.model_name = model_name
        self.debug = debug
        self.created = int(time.time())
        self.metrics = ServeMetrics(engine)
        self.runner = Runner(engine, self.metrics, max_waiting, retry_after_s)
        self.responses = Responses(engine, model_name)
        names = [model_name]
        if Path(model_name).name and Path(model_name).name != model_name:
            names.append(Path(model_name).name)
        self.model_names = tuple(names)
        self.top_k = engine.config.top_k

    def engine_info(self) -> dict:
        """What a client needs to reproduce a workload here: the pipeline's shape and policy."""
        c = self.engine.config
        return {"pp": c.num_stages, "policy": self.engine.policy, "dtype": c.dtype, "block_size": c.block_size,
                "vocab_size": self.engine.vocab_size, "stage_num_blocks": list(self.engine.stage_num_blocks),
                "debug": self.debug}

    # ---- endpoints ---------------------------------------------------------------------------

    async def completions(self, request: Request):
        req = self._counted(parse_completion, await self._json(request), self.model_names, self.top_k)
        token_lists = await self._tokenize(req.prompts, "prompt")
        # the prompt's own logprobs (vLLM's prompt_logprobs, or OpenAI's echo with logprobs):
        # every position is computed, none served from the cache
        wants_prompt = req.prompt_logprobs is not None or (req.echo and req.logprobs is not None)
        submission = await self.runner.submit(token_lists, [0 if wants_prompt else None] * len(token_lists),
                                              req.kv_transfer)
        if req.stream:
            return StreamingResponse(
                completion_events(self.runner, self.responses, request, req, token_lists, submission),
                media_type="text/event-stream", headers=SSE_HEADERS)
        results = await self.runner.results(request, submission)
        return [] if results is None else self.responses.completion(req, token_lists, results)

    async def chat(self, request: Request):
        req = self._counted(parse_chat, await self._json(request), self.model_names, self.top_k)
        ids = await self._chat_ids(req.messages, req.add_generation_prompt, req.continue_final_message)
        submission = await self.runner.submit([ids], [None], req.kv_transfer)
        if req.stream:
            return StreamingResponse(chat_events(self.runner, self.responses, request, req, ids, submission),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        results = await self.runner.results(request, submission)
        return [] if results is None else self.responses.chat(req, ids, results[0])

    async def score(self, request: Request):
        req = self._counted(parse_score, await self._json(request), self.model_names, self.engine.vocab_size)
        query = (await self._tokenize((req.query,), "query"))[0]
        items = await self._tokenize(req.items, "items")
        prompts = score_prompts(query, items, req.label_token_ids, req.item_first)
        self._check_lengths([p.token_ids for p in prompts], "items")
        submission = await self.runner.submit([p.token_ids for p in prompts], [p.logprob_start for p in prompts])
        results = await self.runner.results(request, submission)
        return [] if results is None else score_response(req, prompts, results, self.model_name)

    async def tokenize(self, request: Request):
        req = self._counted(parse_tokenize, await self._json(request), self.model_names)
        if req.messages is not None:
            ids = await self._chat_ids(req.messages, req.add_generation_prompt, req.continue_final_message,
                                       check_length=False)
        else:
            ids = [] if not req.prompt else await self._engine_call(
                "prompt", self.engine.tokenize, req.prompt, add_special_tokens=req.add_special_tokens)
        strs = await self.runner.call(self.engine.token_strs, ids) if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": self.engine.max_prompt_tokens, "tokens": ids,
                "token_strs": strs}

    async def detokenize(self, request: Request):
        ids = self._counted(parse_detokenize, await self._json(request), self.model_names, self.engine.vocab_size)
        text = await self.runner.call(self.engine.decode, ids)
        if text is None:
            raise APIError(400, "the model has no tokenizer: token ids cannot be turned into text", "tokens")
        return {"prompt": text}

    # ---- the steps of a request --------------------------------------------------------------

    async def _json(self, request: Request):
        try:
            raw = await request.body()
        except ClientDisconnect:
            # nothing was submitted; the answer goes nowhere, but the handler must end quietly
            self.metrics.count("aborted")
            raise APIError(499, "the client closed the connection before its request arrived",
                           type_="client_closed_request") from None
        return self._counted(parse_json, raw)

    def _counted(self, parse, *args):
        try:
            return parse(*args)
        except APIError:
            self.metrics.count("bad_request")
            raise

    async def _engine_call(self, field: str, fn, *args, **kwargs):
        """An engine call on the pool whose ValueError is the client's: a 400 naming `field`."""
        try:
            return await self.runner.call(fn, *args, **kwargs)
        except ValueError as exc:
            self.metrics.count("bad_request")
            raise APIError(400, f"{field}: {exc}", field) from None

    async def _tokenize(self, prompts, field: str) -> list[list[int]]:
        """Every prompt's token ids (on the pool); a 400 naming the first one the engine refuses."""
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
        out = await self.runner.call(tokenize_all)
        self._check_lengths(out, field)
        return out

    async def _chat_ids(self, messages, add_generation_prompt: bool, continue_final_message: bool,
                        check_length: bool = True) -> list[int]:
        ids = await self._engine_call("messages", self.engine.apply_chat_template, messages,
                                      add_generation_prompt=add_generation_prompt,
                                      continue_final_message=continue_final_message)
        if check_length:
            self._check_lengths([ids], "messages")
        return ids

    def _check_lengths(self, token_lists, field: str) -> None:
        longest = self.engine.max_prompt_tokens
        for i, ids in enumerate(token_lists):
            if len(ids) > longest:
                name = field if len(token_lists) == 1 else f"{field}[{i}]"
                self.metrics.count("bad_request")
                raise APIError(400, f"{name} has {len(ids)} tokens; this server holds at most "
                                    f"{longest} tokens per prompt (the model's positions and the "
                                    f"smallest stage's cache)", name)
