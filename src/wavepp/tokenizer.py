"""A model's tokenizer (transformers' AutoTokenizer from the model's directory): loaded once, and
used by every thread through a copy of its own.

Why a copy per thread, not one lock: a fast tokenizer's encode may change its own truncation
and padding settings before it runs, so one instance called from two threads fails ("Already
borrowed"). One lock around it made every caller wait for the longest call: a 16 MiB prompt held
every other request's tokenizing, and the engine's result thread (which decodes first tokens
under the engine's lock), for 14 s. Each thread now encodes and decodes on its own copy
(a deep copy of the loaded one: about 0.1 s, once per thread; the engine's threads are a fixed
pool), and the Rust encoder releases the GIL, so a long prompt holds nobody but its own thread.
The copy itself holds the GIL while it is made: the server's pools make theirs when they start
(`prepare`), not at a request.

`token_text` (one token decoded alone) is asked for every token an answer shows; its results are
kept in a dict (at most one entry per vocabulary token), read without a lock.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Sequence


class Tokenizer:
    def __init__(self, model_path: Path):
        self.model_path = model_path
        self._loaded = None  # the instance loaded from disk; copied, never used
        self._load_lock = threading.Lock()
        self._local = threading.local()
        self._token_texts: dict[int, str] = {}
        self._max_token_chars: int | None = None

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The text's token ids. ValueError when the model has no usable tokenizer."""
        return list(self._own()(text, add_special_tokens=add_special_tokens).input_ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._own().decode(list(token_ids))

    def token_text(self, token_id: int) -> str:
        """One token decoded alone (what an answer shows for it), cached."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self._own().decode([token_id])
        return text

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        """Each token's string in the vocabulary (not decoded text)."""
        return list(self._own().convert_ids_to_tokens(list(token_ids)))

    def max_token_chars(self) -> int:
        """The length of the vocabulary's longest token string (at least 1), a bound on the
        characters one token stands for (a byte-level token's string has one character per
        byte; a byte-fallback piece like "<0x41>" is longer than its text): so a text of n
        characters has at least n / max_token_chars() tokens, before any normalization."""
        if self._max_token_chars is None:
            self._max_token_chars = max(map(len, self._own().get_vocab()), default=1) or 1
        return self._max_token_chars

    def chat_text(
        self, messages: Sequence[dict], *, add_generation_prompt: bool, continue_final_message: bool
    ) -> str:
        """Chat messages rendered by the model's chat template. ValueError when there is no
        template, or the template refuses the messages (its own raise_exception)."""
        import jinja2

        hf = self._own()
        if not getattr(hf, "chat_template", None):
            raise ValueError(f"the model at {self.model_path} has no chat template")
        try:
            return hf.apply_chat_template(
                list(messages),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
            )
        except (jinja2.TemplateError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise ValueError(f"the chat template refused the messages: {exc}") from None

    def prepare(self) -> None:
        """Make this thread's copy now (a thread pool's initializer: serve/runner.py), so that
        no request pays for it; nothing when the model has no usable tokenizer."""
        try:
            self._own()
        except ValueError:
            pass

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    def token_text_if_loaded(self, token_id: int) -> str | None:
        """token_text() if the tokenizer was loaded already, else None (loading takes a while:
        the engine's result thread does not pay for it)."""
        return self.token_text(token_id) if self._loaded is not None else None

    def _own(self):
        """This thread's copy of the tokenizer, made on its first call."""
        hf = getattr(self._local, "hf", None)
        if hf is None:
            hf = self._local.hf = copy.deepcopy(self._load())
        return hf

    def _load(self):
        """The transformers tokenizer, loaded on first use (by one thread; the others wait)."""
        with self._load_lock:
            if self._loaded is None:
                import transformers

                transformers.logging.set_verbosity_error()
                try:
                    self._loaded = transformers.AutoTokenizer.from_pretrained(self.model_path)
                except (OSError, ValueError) as exc:
                    raise ValueError(
                        f"the model at {self.model_path} has no usable tokenizer; "
                        f"pass token ids instead of text ({exc})"
                    ) from None
            return self._loaded
