"""A real `wavepp serve` in a subprocess on a free loopback port, over a tiny Llama (fp32) with
a byte-level tokenizer (256 tokens: one per byte), so text prompts work too."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from wavepp.bench.http import wait_until_healthy
from wavepp.random_checkpoint import make_model
from wavepp.runtime.launch import free_port

VOCAB = 256
MAX_POSITIONS = 512


def make_tiny(path: Path) -> Path:
    path = make_model(
        path,
        arch="llama",
        num_layers=4,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=MAX_POSITIONS,
        seed=5,
    )
    save_byte_tokenizer(path)
    return path


def save_byte_tokenizer(path: Path) -> None:
    """A byte-level tokenizer (token id = byte, 256 tokens) with a chat template, into `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(
        models.BPE({ch: b for b, ch in _bytes_to_unicode().items()}, [])
    )  # token id = byte
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


# SmolLM2's template, in ASCII (no special tokens in a byte-level vocabulary)
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<s>system\nYou are a tiny model.</s>\n' }}{% endif %}"
    "{{ '<s>' + message['role'] + '\n' + message['content'] + '</s>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what the ByteLevel pre-tokenizer emits)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class ServerProcess:
    """`wavepp serve` as a child process; stop() sends SIGTERM and waits for it."""

    def __init__(
        self,
        model: Path,
        *args: str,
        pp: int = 2,
        start_timeout_s: float = 90,
        debug: bool = True,
        env: dict | None = None,
    ):
        self.model = str(model)
        # free_port() finds a port free now; another process may bind it before the server
        # does: that start is tried again on a new port (the server says "address already in use")
        for attempt in range(3):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            cmd = [
                sys.executable,
                "-m",
                "wavepp.cli",
                "serve",
                "--model",
                self.model,
                "--pp",
                str(pp),
                "--port",
                str(self.port),
                "--dtype",
                "float32",
                *(["--debug"] if debug else []),
                *args,
            ]
            self.proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
            )
            # The server's output is read as it comes: a pipe nobody reads fills (64 KiB) over
            # a package's worth of tests, and the server then blocks on its next log line.
            self.output: collections.deque[str] = collections.deque(maxlen=200)
            self.output_chars = 0
            self.tracebacks = 0  # "Traceback" lines the server printed, all of its life
            self._reader = threading.Thread(target=self._drain, daemon=True)
            self._reader.start()
            try:
                wait_until_healthy(self.url, self.proc, timeout_s=start_timeout_s)
                break
            except RuntimeError as exc:
                if self.proc.poll() is None:
                    self.proc.kill()
                self._reader.join(5)
                taken = "address already in use" in "".join(self.output)
                if not taken or attempt == 2:
                    raise RuntimeError(f"{exc}: {''.join(self.output)}") from None
        self.stage_pids = stage_pids(self.proc.pid)

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            self.output_chars += len(line)
            self.tracebacks += line.startswith("Traceback")

    def stop(self, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode


def stage_pids(pid: int) -> list[int]:
    """The stage processes (multiprocessing spawn children) of process `pid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"multiprocessing-fork" in cmdline:
            out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="package")
def tiny_model(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="package")
def server(tiny_model):
    srv = ServerProcess(tiny_model)
    yield srv
    srv.stop()


_HF = {}


def hf_logprobs(path, token_ids):
    """transformers' log-softmax at every position of token_ids: [len, vocab] fp32."""
    import torch
    import transformers

    if str(path) not in _HF:
        transformers.logging.set_verbosity_error()
        _HF[str(path)] = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32
        ).eval()
    with torch.no_grad():
        logits = _HF[str(path)](torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


@contextlib.contextmanager
def app_in_thread(app, timeout_s: float = 30):
    """Serve an ASGI `app` with uvicorn on a free loopback port in a daemon thread: yields its
    URL once the server has started, stops it on exit."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
