"""The tokenizer under threads: a long encode holds nobody else's encode or token text (each
thread works on a copy of its own), and answers are what one instance gives alone."""

from __future__ import annotations

import threading
import time

import pytest
import transformers

from tests.serve.conftest import save_byte_tokenizer
from wavepp.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    save_byte_tokenizer(path)
    return path


def _while_encoding(tok: Tokenizer, long_text: str, fn):
    """fn()'s seconds, called while another thread encodes `long_text`; and that encode's."""
    started, spans = threading.Event(), {}

    def long():
        started.set()
        t0 = time.perf_counter()
        tok.encode(long_text)
        spans["long"] = time.perf_counter() - t0

    thread = threading.Thread(target=long)
    thread.start()
    started.wait()
    time.sleep(0.05)  # the long encode is under way
    t0 = time.perf_counter()
    fn()
    spans["short"] = time.perf_counter() - t0
    thread.join()
    return spans


def test_a_long_encode_holds_no_other_thread(byte_tokenizer):
    tok = Tokenizer(byte_tokenizer)
    assert tok.encode("warm") == list(b"warm")
    long_text = "abcd efgh " * 300_000  # 3 MB: most of a second or more to encode
    spans = _while_encoding(tok, long_text, lambda: tok.encode("hello"))
    # with one lock for every caller the short encode waited for the whole long one
    assert spans["long"] > 0.3, spans
    assert spans["short"] < spans["long"] / 5, spans


def test_token_text_does_not_wait_for_an_encode(byte_tokenizer):
    """The engine's result thread names each first token (token_text_if_loaded) under the
    engine's lock: it must not wait for a prompt being tokenized."""
    tok = Tokenizer(byte_tokenizer)
    assert tok.token_text_if_loaded(104) is None  # not loaded: nothing is paid for it
    tok.encode("x")
    spans = _while_encoding(tok, "abcd efgh " * 300_000, lambda: tok.token_text_if_loaded(104))
    assert spans["short"] < spans["long"] / 5, spans


def test_answers_match_one_instance(byte_tokenizer):
    tok = Tokenizer(byte_tokenizer)
    ref = transformers.AutoTokenizer.from_pretrained(byte_tokenizer)
    texts = [f"text {i} \u00e9\u4e2d" * (i + 1) for i in range(16)]
    out = {}

    def work(i):
        out[i] = (
            tok.encode(texts[i]),
            tok.decode(list(range(40 + i, 60 + i))),
            [tok.token_text(t) for t in range(32, 40)],
        )

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (ids, text, token_texts) in out.items():
        assert ids == ref(texts[i]).input_ids
        assert text == ref.decode(list(range(40 + i, 60 + i)))
        assert token_texts == [ref.decode([t]) for t in range(32, 40)]
    assert tok.max_token_chars() == 1  # one character per byte-level token


def test_the_servers_pools_make_their_copies_when_they_start_not_at_a_request(
    byte_tokenizer, monkeypatch
):
    """A copy made at a request holds the GIL for about 0.1 s (the leader's admission round and
    the event loop with it): Runner.start_threads makes every pool thread's copy up front, and
    a burst of encodes after it makes none."""
    from wavepp.serve import runner as runner_mod

    tok = Tokenizer(byte_tokenizer)
    copies = []
    real_own = Tokenizer._own

    def counting_own(self):
        if getattr(self._local, "hf", None) is None:
            copies.append(threading.current_thread().name)
        return real_own(self)

    monkeypatch.setattr(Tokenizer, "_own", counting_own)

    class FakeEngine:
        tokenizer = tok

    runner = runner_mod.Runner(FakeEngine(), metrics=None, max_waiting=1, retry_after_s=1)
    try:
        runner.start_threads()
        made = len(copies)
        assert made == runner_mod.ENGINE_THREADS + runner_mod.WORK_THREADS
        assert len(set(copies)) == made  # one per thread
        burst = [runner.work_pool.submit(tok.encode, "a burst " * 50) for _ in range(32)]
        burst += [runner.pool.submit(tok.token_text, 65) for _ in range(32)]
        assert all(f.result() for f in burst)
        assert len(copies) == made
    finally:
        runner.close()
