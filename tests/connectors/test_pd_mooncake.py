"""Disaggregated serving over Mooncake's transfer engine, the three processes over HTTP: `wavepp
serve --pp 2 --kv-transport mooncake` (no store: each stage keeps its part in an arena of its
own), vLLM's OpenAI server with the WavePPConnector and an empty `kv_connector_extra_config` (no
path to any of the prefill's files: the two run with temp directories of their own, and the
prefill writes no KV to a file at all), and `wavepp route` in front.

16 prompts sharing prefixes decode the same 8 greedy tokens as vLLM computing them itself, at
vLLM's default block size (128 on the CPU); vLLM reports every prompt token but the last as
loaded from outside (the last block partly filled); the stages' arenas are empty once vLLM's
requests finished; a poisoned part (written into a stage's arena over the network) changes
vLLM's output; an id with no parts, a part already freed and a stage process killed after the
prefill each make vLLM compute the prompt, with the right tokens."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import httpx
import pytest
import torch

from tests.connectors.helpers import (
    MOONCAKE_PREFILL,
    arenas_empty,
    grouped_prompts,
    loaded_tokens,
    needs_vllm,
    poison_part,
    start_decode_and_route,
    stop,
)
from tests.eventually import eventually
from tests.serve.conftest import ServerProcess, stage_pids
from wavepp.kv_transfer.mooncake.engine import TransferEngineHandle
from wavepp.kv_transfer.mooncake.puller import ArenaPuller
from wavepp.model_store import resolve_model

pytestmark = [pytest.mark.slow, needs_vllm]


def test_prefill_in_wavepp_decode_in_vllm_over_the_transfer_engine(tmp_path):
    model = str(resolve_model("smollm2"))
    # temp directories of their own (vLLM's short: its sockets live there)
    prefill_tmp = tmp_path / "prefill-tmp"
    prefill_tmp.mkdir()
    decode_tmp = Path(tempfile.mkdtemp(prefix="vllm-"))
    prefill = ServerProcess(
        Path(model),
        *MOONCAKE_PREFILL,
        start_timeout_s=300,
        debug=False,
        env={"TMPDIR": str(prefill_tmp)},
    )
    procs = []
    try:
        procs, vllm_url, route_url = start_decode_and_route(
            model,
            None,
            prefill.url,
            tmp_path,
            "--dtype",
            "float32",
            "--max-model-len",
            "1024",
            env={"TMPDIR": str(decode_tmp)},
        )
        prompts = grouped_prompts()
        with httpx.Client(timeout=600) as client:

            def complete(url, prompt, params=None, max_tokens=8):
                body = {
                    "model": model,
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

            def tokens(answer):
                return answer["choices"][0]["logprobs"]["tokens"]

            def cached(answer):
                return (answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)

            routed = [complete(route_url, p) for p in prompts]
            alone = [complete(vllm_url, p) for p in prompts]
            metrics = client.get(f"{vllm_url}/metrics").text
            for p, r, a in zip(prompts, routed, alone):
                assert tokens(r) == tokens(a)
                assert cached(r) == len(p) - 1  # every token but the last, whatever the block
                assert cached(a) == 0
            assert loaded_tokens(metrics) == sum(len(p) - 1 for p in prompts)

            # vLLM released every part it pulled: both stages' arenas are empty
            assert eventually(lambda: arenas_empty(client, prefill.url, 2), timeout_s=20)

            def prefill_only(prompt):
                answer = complete(prefill.url, prompt, {"do_remote_decode": True}, max_tokens=1)
                assert "error" not in answer["kv_transfer_params"], answer
                return answer["kv_transfer_params"]

            # vLLM really reads the KV: noise written into every stage's value rows loads and
            # changes the output
            engine = TransferEngineHandle.start("127.0.0.1")
            params = prefill_only(prompts[0])
            for location in params["stages"]:
                poison_part(location, engine, "value")
            poisoned = complete(vllm_url, prompts[0], params)
            assert cached(poisoned) == len(prompts[0]) - 1
            assert tokens(poisoned) != tokens(alone[0])
            # an id with no parts (and no store): computed
            never = complete(vllm_url, prompts[1], {"transfer_id": "never"})
            assert tokens(never) == tokens(alone[1]) and cached(never) == 0
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
            freed = complete(vllm_url, prompts[2], params)
            assert tokens(freed) == tokens(alone[2])
            # a stage process killed after the prefill: its session is gone, vLLM computes
            params = prefill_only(prompts[3])
            (stage1,) = stage_pids(prefill.proc.pid)
            os.kill(stage1, signal.SIGKILL)
            killed = complete(vllm_url, prompts[3], params)
            assert tokens(killed) == tokens(alone[3])
            log = (tmp_path / "vllm.log").read_text()
            assert log.count("could not be pulled") == 2, log[-3000:]
            puller.close()
            engine.close()
    finally:
        stop(procs)
        prefill.stop()
        shutil.rmtree(decode_tmp, ignore_errors=True)
    # the prefill handed no KV on through a file
    assert not [p for p in prefill_tmp.rglob("*") if p.suffix in (".safetensors", ".json")]
