"""A model's tokenizer (transformers' AutoTokenizer from the model's directory), loaded on first
use and called by one thread at a time.

Why the lock: a fast tokenizer's encode may change its own truncation and padding settings
before it runs, and a call from another thread meanwhile fails ("Already borrowed"); the server
tokenizes and decodes from several threads, and the engine decodes first tokens on its own.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Sequence


class Tokenizer:
    def __init__(self, model_path: Path):
        self.model_path = model_path
        self._hf = None
        self._lock = threading.Lock()

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The text's token ids. ValueError when the model has no usable tokenizer."""
        with self._lock:
            return list(self._load()(text, add_special_tokens=add_special_tokens).input_ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        with self._lock:
            return self._load().decode(list(token_ids))

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        """Each token's string in the vocabulary (not decoded text)."""
        with self._lock:
            return list(self._load().convert_ids_to_tokens(list(token_ids)))

    def chat_text(self, messages: Sequence[dict], *, add_generation_prompt: bool,
                  continue_final_message: bool) -> str:
        """Chat messages rendered by the model's chat template. ValueError when there is no
        template, or the template refuses the messages (its own raise_exception)."""
        import jinja2

        with self._lock:
            hf = self._load()
            if not getattr(hf, "chat_template", None):
                raise ValueError(f"the model at {self.model_path} has no chat template")
            try:
                return hf.apply_chat_template(list(messages), tokenize=False,
                                              add_generation_prompt=add_generation_prompt,
                                              continue_final_message=continue_final_message)
            except (jinja2.TemplateError, ValueError, TypeError, KeyError, IndexError) as exc:
                raise ValueError(f"the chat template refused the messages: {exc}") from None

    def decode_if_loaded(self, token_ids: Sequence[int]) -> str | None:
        """decode() if the tokenizer was loaded already, else None (loading takes a while: the
        engine's result thread does not pay for it)."""
        with self._lock:
            return None if self._hf is None else self._hf.decode(list(token_ids))

    def _load(self):
        """Under the lock: the transformers tokenizer, loaded on first use."""
        if self._hf is None:
            import transformers
            transformers.logging.set_verbosity_error()
            try:
                self._hf = transformers.AutoTokenizer.from_pretrained(self.model_path)
            except (OSError, ValueError) as exc:
                raise ValueError(f"the model at {self.model_path} has no usable tokenizer; "
                                 f"pass token ids instead of text ({exc})") from None
        return self._hf
