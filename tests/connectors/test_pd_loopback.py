"""The three processes of disaggregated serving on loopback, over each transport: `wavepp serve
--pp 2` (handing the KV on through the directory store, or over Mooncake's transfer engine),
vLLM's OpenAI server (its CPU build, in `.venv-vllm`) with the WavePPConnector at its default block
size (128 on this CPU), and `wavepp route` in front.

One vLLM serves both tests (its start-up is most of their time): its connector reads the store
when a request's params name no stages, and pulls from the stages when they do. Its
`kv_connector_extra_config` names the store directory only; the Mooncake prefill has no store and
a temp directory of its own, and writes no file of the hand-off at all.

Each test: 16 prompts sharing prefixes through the router decode the same 8 greedy tokens as vLLM
computing them itself; vLLM reports every prompt token but the last as loaded from outside (the
last block partly filled), in each answer and in its metrics; what was handed on is freed once
vLLM's requests finished; a poisoned transfer changes vLLM's output (it really reads the KV); a
transfer that cannot be read makes vLLM compute the prompt, with the right tokens."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from tests.connectors.helpers import (
    MOONCAKE_PREFILL,
    NO_PROFILE,
    arenas_empty,
    grouped_prompts,
    loaded_tokens,
    needs_vllm,
    poison,
    poison_part,
    pull_counts,
    sample,
    start_route,
    start_vllm,
    stop,
    wait_for_transfer,
    wait_healthy,
)
from tests.eventually import eventually
from tests.serve.conftest import ServerProcess, stage_pids
from wavepp.kv_transfer.directory import DirectoryStore
from wavepp.kv_transfer.mooncake.engine import TransferEngineHandle
from wavepp.kv_transfer.mooncake.puller import ArenaPuller
from wavepp.model_store import resolve_model

DECODE_TOKENS = 8  # greedy tokens decoded per prompt
TRANSFER_TIMEOUT_S = 6.0  # the decode side's: a pull without progress this long fails

pytestmark = [pytest.mark.slow, needs_vllm]


class Decode:
    """vLLM with the connector, started at once, waited for on first use (a test starts its
    prefill server meanwhile)."""

    def __init__(self, model: str, store: Path, workdir: Path):
        self.model, self.store, self.log = model, store, workdir / "vllm.log"
        # a temp directory of its own, short: vLLM's sockets live there
        self.tmp = Path(tempfile.mkdtemp(prefix="vllm-"))
        self.proc, self.url = start_vllm(
            model,
            store,
            self.log,
            "--dtype",
            "float32",
            "--max-model-len",
            "1024",
            env={"TMPDIR": str(self.tmp)},
            extra={"async_load": True, "transfer_timeout_s": TRANSFER_TIMEOUT_S},
        )
        self._healthy = False

    def route(self, prefill_url: str, log: Path) -> tuple:
        """`wavepp route` in front of `prefill_url` and this vLLM, both healthy."""
        route, route_url = start_route(prefill_url, self.url, log)
        try:
            checks = [(route, route_url, log)]
            if not self._healthy:
                checks.insert(0, (self.proc, self.url, self.log))
            wait_healthy(checks)
            self._healthy = True
        except BaseException:
            stop([route])
            raise
        return route, route_url

    def complete(self, client, url: str, prompt, params=None, max_tokens=DECODE_TOKENS) -> dict:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": 1,
        }
        if params is not None:
            body["kv_transfer_params"] = params
        r = client.post(f"{url}/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def close(self) -> None:
        stop([self.proc])
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("decode")
    store = workdir / "store"
    store.mkdir()
    d = Decode(str(resolve_model("smollm2")), store, workdir)
    try:
        yield d
    finally:
        d.close()


def tokens(answer: dict) -> list:
    return answer["choices"][0]["logprobs"]["tokens"]


def cached(answer: dict) -> int:
    return (answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def routed_equal_alone(decode: Decode, client, route_url: str, prompts) -> list[dict]:
    """Every prompt through the router, then computed by vLLM alone: the same greedy tokens;
    every prompt token but the last loaded (each answer and vLLM's counter); -> vLLM's own
    answers."""
    before = loaded_tokens(client.get(f"{decode.url}/metrics").text)
    routed = [decode.complete(client, route_url, p) for p in prompts]
    alone = [decode.complete(client, decode.url, p) for p in prompts]
    after = loaded_tokens(client.get(f"{decode.url}/metrics").text)
    for p, r, a in zip(prompts, routed, alone):
        assert tokens(r) == tokens(a)
        assert cached(r) == len(p) - 1  # every token but the last, whatever the block
        assert cached(a) == 0
    assert after - before == sum(len(p) - 1 for p in prompts)
    return alone


def own_and_other(decode: Decode, client, params: dict, stage_pid: int) -> tuple:
    """With `stage_pid` stopped (SIGSTOP), the prompt of `params` sent to vLLM (its pull of that
    stage's part stalls), then, once its pull is under way, prompt 5 with nothing to load;
    the stage goes on after. -> ((seconds, answer) of each) from the first's start."""
    prompts = grouped_prompts()
    done: dict = {}
    t0 = time.monotonic()

    def send(name, prompt, params=None):
        answer = decode.complete(client, decode.url, prompt, params)
        done[name] = (time.monotonic() - t0, answer)

    os.kill(stage_pid, signal.SIGSTOP)
    try:
        worker = threading.Thread(target=send, args=("stalled", prompts[4], params))
        worker.start()
        time.sleep(0.5)  # scheduled, its pull started
        send("other", prompts[5])
        worker.join(timeout=60)
    finally:
        os.kill(stage_pid, signal.SIGCONT)
    return done["stalled"], done["other"]


def test_prefill_in_wavepp_decode_in_vllm_through_the_store(decode, tmp_path):
    """`wavepp serve --kv-store` writes each stage's part into the directory vLLM reads."""
    model, store = decode.model, decode.store
    prefill = ServerProcess(
        Path(model), *NO_PROFILE, "--kv-store", str(store), start_timeout_s=300, debug=False
    )
    route = None
    try:
        route, route_url = decode.route(prefill.url, tmp_path / "route.log")
        prompts = grouped_prompts()
        with httpx.Client(timeout=600) as client:
            alone = routed_equal_alone(decode, client, route_url, prompts)
            # each transfer is dropped once vLLM's request finished
            assert eventually(lambda: not any(store.iterdir()), timeout_s=10)

            # vLLM really reads the KV: a poisoned copy (values replaced, checksums rewritten)
            # loads and changes the output; a transfer never written computes the prompt
            first = decode.complete(
                client, prefill.url, prompts[0], {"do_remote_decode": True}, max_tokens=1
            )
            assert tokens(first)[0] == tokens(alone[0])[0]
            transfer_id = first["kv_transfer_params"]["transfer_id"]
            kv = DirectoryStore(store)
            wait_for_transfer(kv, transfer_id)
            shutil.copytree(store / transfer_id, store / "poisoned")
            poison(kv, "poisoned")
            poisoned = decode.complete(client, decode.url, prompts[0], {"transfer_id": "poisoned"})
            never = decode.complete(client, decode.url, prompts[1], {"transfer_id": "never"})
        assert cached(poisoned) == len(prompts[0]) - 1
        assert tokens(poisoned) != tokens(alone[0])
        assert cached(never) == 0 and tokens(never) == tokens(alone[1])
    finally:
        if route is not None:
            stop([route])
        prefill.stop()


def test_prefill_in_wavepp_decode_in_vllm_over_the_transfer_engine(decode, tmp_path):
    """`wavepp serve --kv-transport mooncake` (no store): each stage keeps its part in an arena
    of its own and vLLM pulls it from there; a part released before vLLM pulls it, and a stage
    process killed after the prefill, each fail the pull, and vLLM computes."""
    model = decode.model
    prefill_tmp = tmp_path / "prefill-tmp"
    prefill_tmp.mkdir()
    prefill = ServerProcess(
        Path(model),
        *MOONCAKE_PREFILL,
        start_timeout_s=300,
        debug=False,
        env={"TMPDIR": str(prefill_tmp)},
    )
    route = None
    try:
        route, route_url = decode.route(prefill.url, tmp_path / "route.log")
        failed_before = decode.log.read_text().count("could not be pulled")
        prompts = grouped_prompts()
        with httpx.Client(timeout=600) as client:
            alone = routed_equal_alone(decode, client, route_url, prompts)
            # vLLM released every part it pulled: both stages' arenas are empty
            assert eventually(lambda: arenas_empty(client, prefill.url, 2), timeout_s=20)

            def prefill_only(prompt):
                answer = decode.complete(
                    client, prefill.url, prompt, {"do_remote_decode": True}, max_tokens=1
                )
                assert "error" not in answer["kv_transfer_params"], answer
                return answer["kv_transfer_params"]

            # vLLM really reads the KV: noise written into every stage's value rows loads and
            # changes the output
            engine = TransferEngineHandle.start("127.0.0.1")
            params = prefill_only(prompts[0])
            for location in params["stages"]:
                poison_part(location, engine, "value")
            poisoned = decode.complete(client, decode.url, prompts[0], params)
            assert cached(poisoned) == len(prompts[0]) - 1
            assert tokens(poisoned) != tokens(alone[0])
            # a part freed before vLLM pulls it: the pull fails, vLLM computes
            params = prefill_only(prompts[2])
            puller = ArenaPuller("127.0.0.1")
            puller.pull(params["stages"], 0, 1)  # starts its engine
            puller.release(params["stages"])
            word = torch.ones(1, dtype=torch.int64)
            engine.register(word)

            def seqs():
                for loc in params["stages"]:
                    engine.read(loc["session"], [(word.data_ptr(), loc["entry_addr"], 8)])
                    yield int(word[0])

            assert eventually(lambda: set(seqs()) == {0})  # both stages freed their part
            freed = decode.complete(client, decode.url, prompts[2], params)
            assert tokens(freed) == tokens(alone[2])
            # a pull that stalls (stage 1's process stopped: its connection open, nothing sent)
            # holds up its own request only: one with nothing to load, sent meanwhile, is
            # answered at once; the stalled pull fails at the transfer timeout, vLLM computes
            (stage1,) = stage_pids(prefill.proc.pid)
            stalled, other = own_and_other(decode, client, prefill_only(prompts[4]), stage1)
            assert tokens(stalled[1]) == tokens(alone[4])
            assert tokens(other[1]) == tokens(alone[5]) and cached(other[1]) == 0
            print(
                f"during a stalled pull: the other answered at {other[0]:.1f} s, the stalled at "
                f"{stalled[0]:.1f} s"
            )
            assert other[0] + 2 < stalled[0], (other[0], stalled[0])
            # a stage process killed after the prefill: its session is gone, vLLM computes
            params = prefill_only(prompts[3])
            os.kill(stage1, signal.SIGKILL)
            killed = decode.complete(client, decode.url, prompts[3], params)
            assert tokens(killed) == tokens(alone[3])
            failed = decode.log.read_text().count("could not be pulled") - failed_before
            assert failed == 3, decode.log.read_text()[-3000:]
            # vLLM's /metrics: every pull timed (vllm_metrics.py), by outcome
            assert eventually(lambda: pull_counts(client, decode.url) == (17, 3), timeout_s=10)
            metrics = client.get(f"{decode.url}/metrics").text
            for name in ("pull_wait", "pull", "load"):
                assert sample(metrics, f"vllm:wavepp_kv_{name}_seconds_count") == 20, name
            assert sample(metrics, "vllm:wavepp_kv_pulled_bytes_total") > 0
            puller.close()
            engine.close()
    finally:
        if route is not None:
            stop([route])
        prefill.stop()
    # the prefill handed no KV on through a file
    assert not [p for p in prefill_tmp.rglob("*") if p.suffix in (".safetensors", ".json")]
