"""Disaggregation of an MLA model: a tiny DeepSeek-V3 prefilled by `wavepp serve --pp 2
--kv-transport mooncake`, decoded by vLLM's CPU build pulling the latent pools from each stage's
arena through the WavePPConnector (no store), `wavepp route` in front. The loaded prompts decode
the same greedy tokens, with the same logprobs, as vLLM computing them itself; vLLM reports
every prompt token but the last as cached; the arenas are empty after; poisoned latents change
its output; latents of another width are refused, the reason logged.

vLLM runs fp32 on its CPU_MLA backend (the AMX_MLA backend it would pick on an AMX machine is
bf16 only; both keep one [c | k_pe] row per slot, written by the backend's
`do_kv_cache_update`). The CPU MLA kernels are built for DeepSeek's latent width only
(kv_lora_rank 512 + qk_rope_head_dim 64), so the tiny model keeps those two and shrinks the rest."""

from __future__ import annotations

import copy
import json
import random

import httpx
import pytest

from tests.connectors.helpers import (
    MOONCAKE_PREFILL,
    arenas_empty,
    loaded_tokens,
    needs_vllm,
    poison_part,
    start_decode_and_route,
    stop,
)
from tests.eventually import eventually
from tests.serve.conftest import ServerProcess, save_byte_tokenizer
from wavepp.kv_transfer.mooncake.engine import TransferEngineHandle
from wavepp.random_checkpoint import make_model

pytestmark = [pytest.mark.slow, needs_vllm]


def make_deepseek(path):
    path = make_model(
        path,
        arch="deepseek_v3",
        seed=3,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
    )
    # vLLM's DeepSeek reads the router's scoring from the config, as DeepSeek-V3's own config.json
    # has it; transformers' DeepseekV3 (and wavepp) always route this way
    config = json.loads((path / "config.json").read_text())
    config.update(topk_method="noaux_tc", scoring_func="sigmoid")
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_byte_tokenizer(path)
    return path


def test_deepseek_prefill_in_wavepp_decode_in_vllm_from_the_latents(tmp_path):
    model = str(make_deepseek(tmp_path / "deepseek"))
    prefill = ServerProcess(
        model,
        *MOONCAKE_PREFILL,
        start_timeout_s=300,
        debug=False,
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
            "--attention-backend",
            "CPU_MLA",
            "--max-model-len",
            "512",
            # compiled, as vLLM runs by default: eager (vLLM 0.32 CPU), the first greedy token
            # of this model's decode differed between vLLM's own prefill, ours, and wavepp's
            eager=False,
        )

        # two share a 48-token prefix: wavepp reuses its blocks for the second and exports them too
        rng = random.Random(5)
        prefix = [rng.randrange(256) for _ in range(48)]
        prompts = [prefix + [rng.randrange(256) for _ in range(n)] for n in (22, 37)]
        prompts += [[rng.randrange(256) for _ in range(n)] for n in (100, 33)]
        with httpx.Client(timeout=600) as client:

            def complete(url, prompt, **extra):
                r = client.post(
                    f"{url}/v1/completions",
                    json={
                        "model": model,
                        "prompt": prompt,
                        "max_tokens": 12,
                        "temperature": 0,
                        "logprobs": 1,
                        "return_tokens_as_token_ids": True,
                        **extra,
                    },
                )
                assert r.status_code == 200, r.text
                return r.json()

            routed = [complete(route_url, p) for p in prompts]
            alone = [complete(vllm_url, p) for p in prompts]
            metrics = client.get(f"{vllm_url}/metrics").text
            # each part is released once vLLM pulled it
            assert eventually(lambda: arenas_empty(client, prefill.url, 2), timeout_s=20)

            # latents of another width (another model's) are refused: vLLM computes, and logs why
            first = complete(
                prefill.url, prompts[2], max_tokens=1, kv_transfer_params={"do_remote_decode": True}
            )
            params = first["kv_transfer_params"]
            narrow_params = copy.deepcopy(params)
            for location in narrow_params["stages"]:
                location["pools"]["latent"]["width"] = 24
            narrow = complete(vllm_url, prompts[2], kv_transfer_params=narrow_params)
            # poisoned latents, written into each stage's arena, load and change the output
            engine = TransferEngineHandle.start("127.0.0.1")
            for location in params["stages"]:
                poison_part(location, engine, "latent")
            poisoned = complete(vllm_url, prompts[2], kv_transfer_params=params)
            engine.close()

        def logprobs(answer):
            return answer["choices"][0]["logprobs"]

        for p, r, a in zip(prompts, routed, alone):
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == len(p) - 1
            assert (a["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
            assert logprobs(r)["tokens"] == logprobs(a)["tokens"]
            # fp32 on both sides: the same logprobs but for summation order
            assert logprobs(r)["token_logprobs"] == pytest.approx(
                logprobs(a)["token_logprobs"], abs=1e-3
            )
        assert loaded_tokens(metrics) == sum(len(p) - 1 for p in prompts)
        assert logprobs(first)["tokens"][0] == logprobs(alone[2])["tokens"][0]
        assert poisoned["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompts[2]) - 1
        assert logprobs(poisoned)["tokens"] != logprobs(alone[2])["tokens"]
        assert narrow["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert logprobs(narrow)["tokens"] == logprobs(alone[2])["tokens"]
        assert (
            "its latent rows are 24 wide; this model's are 576"
            in (tmp_path / "vllm.log").read_text()
        )
    finally:
        stop(procs)
        prefill.stop()
