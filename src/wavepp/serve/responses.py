"""Response bodies from PrefillResults: completions' choices with OpenAI's legacy logprobs and
vLLM's prompt_logprobs, chat choices with OpenAI's chat logprobs, and the usage.

A token whose text alone is not valid text (a part of a multi-byte character), or any token
when the model has no tokenizer, is written "token_id:N", so top-logprob keys stay distinct.
"""

from __future__ import annotations

import time
import uuid

from wavepp.engine import Engine
from wavepp.serve.chat import ChatRequest
from wavepp.serve.completion_request import CompletionRequest


class Responses:
    def __init__(self, engine: Engine, model_name: str):
        self.engine = engine
        self.model_name = model_name
        self.has_tokenizer = engine.decode([0]) is not None

    # ---- completions -------------------------------------------------------------------------

    def completion_choice(
        self, req: CompletionRequest, index: int, prompt, ids: list[int], r
    ) -> dict:
        """One prompt's choice: text (the prompt with echo, then the first token with
        max_tokens 1), legacy logprobs, and vLLM's prompt_logprobs when asked."""
        prompt_text = (
            prompt
            if isinstance(prompt, str)
            else (self.engine.decode(ids) if self.has_tokenizer else "")
        )
        text = prompt_text if req.echo else ""
        logprobs = None
        if req.logprobs is not None:
            logprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            if req.echo:  # the prompt's tokens first: the first has no logprob
                pairs = [(None, ())] + list(r.prompt_logprobs)
                offset = 0
                for t, (lp, top) in zip(ids, pairs):
                    self._append_logprob(logprobs, t, lp, top, req.logprobs, offset)
                    offset += len(self.token_text(t))
        if req.max_tokens == 1:
            if logprobs is not None:
                self._append_logprob(
                    logprobs,
                    r.first_token_id,
                    r.first_token_logprob,
                    r.top_logprobs,
                    req.logprobs,
                    len(text),
                )
            text += self.first_text(r)
        choice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": "length",
            "stop_reason": None,
        }
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = [None] + [
                self._vllm_logprobs(t, lp, top, req.prompt_logprobs)
                for t, (lp, top) in zip(ids[1:], r.prompt_logprobs)
            ]
        return choice

    def completion(self, req: CompletionRequest, token_lists, results) -> dict:
        choices = [
            self.completion_choice(req, i, p, ids, r)
            for i, (p, ids, r) in enumerate(zip(req.prompts, token_lists, results))
        ]
        out = {
            "id": new_id("cmpl"),
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": usage(token_lists, results, req.max_tokens),
        }
        if req.kv_transfer:
            out["kv_transfer_params"] = results[0].kv_transfer
        return out

    # ---- chat --------------------------------------------------------------------------------

    def chat_logprobs(self, req: ChatRequest, r) -> dict | None:
        """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""
        if req.top_logprobs is None:
            return None
        if req.max_tokens == 0:
            return {"content": []}
        entry = self._chat_token(r.first_token_id, r.first_token_logprob)
        entry["top_logprobs"] = [
            self._chat_token(t, lp) for t, lp in r.top_logprobs[: req.top_logprobs]
        ]
        return {"content": [entry]}

    def chat(self, req: ChatRequest, ids: list[int], r) -> dict:
        content = self.first_text(r) if req.max_tokens == 1 else ""
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": self.chat_logprobs(req, r),
            "finish_reason": "length",
            "stop_reason": None,
        }
        out = {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": usage([ids], [r], req.max_tokens),
        }
        if req.kv_transfer:
            out["kv_transfer_params"] = r.kv_transfer
        return out

    # ---- tokens ------------------------------------------------------------------------------

    def first_text(self, r) -> str:
        """The first token's text, as the answer's text."""
        if self.has_tokenizer:
            return self.engine.tokenizer.token_text(r.first_token_id)
        return self.token_text(r.first_token_id)

    def token_text(self, token_id: int) -> str:
        """A token's text (decoded alone, cached by the tokenizer); "token_id:N" when there is
        no tokenizer or the token alone is not valid text."""
        if self.has_tokenizer:
            text = self.engine.tokenizer.token_text(token_id)
            if "\ufffd" not in text:
                return text
        return f"token_id:{token_id}"

    def _chat_token(self, token_id: int, logprob: float) -> dict:
        text = self.token_text(token_id)
        raw = None if text.startswith("token_id:") else list(text.encode())
        return {"token": text, "logprob": logprob, "bytes": raw}

    def _append_logprob(self, out: dict, token_id: int, logprob, top, k: int, offset: int) -> None:
        """One token of OpenAI's legacy logprobs: its text, logprob, top-k dict and offset."""
        out["tokens"].append(self.token_text(token_id))
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(
            None if logprob is None else {self.token_text(t): lp for t, lp in top[:k]}
        )
        out["text_offset"].append(offset)

    def _vllm_logprobs(self, token_id: int, logprob: float, top, k: int) -> dict:
        """One position of vLLM's prompt_logprobs: {token id: {logprob, rank, decoded_token}},
        the prompt's token and the top k (rank: 1 for the best; null outside the top)."""
        out = {}
        for rank, (t, lp) in enumerate(top[:k], start=1):
            out[str(t)] = {"logprob": lp, "rank": rank, "decoded_token": self.token_text(t)}
        if str(token_id) not in out:
            ranks = [rank for rank, (t, _) in enumerate(top, start=1) if t == token_id]
            out[str(token_id)] = {
                "logprob": logprob,
                "rank": ranks[0] if ranks else None,
                "decoded_token": self.token_text(token_id),
            }
        return out


def usage(token_lists, results, max_tokens: int) -> dict:
    """prompt, completion (max_tokens per prompt) and total tokens, and the cached ones."""
    num_prompt = sum(len(ids) for ids in token_lists)
    num_completion = max_tokens * len(token_lists)
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
        "prompt_tokens_details": {"cached_tokens": sum(r.num_cached_tokens for r in results)},
    }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
