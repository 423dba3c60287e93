"""The KV hand-off, against transformers: what the stages export is the prompt's KV cache, and a
decode that continues from it generates what a decode from the prompt generates.

Each stage writes its own layers (kv_transfer/export.py) into the directory store; the test
reads the transfer back, builds transformers' DynamicCache from it and runs `generate`."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
import torch
import transformers
from safetensors.torch import load_file

from tests.eventually import eventually
from wavepp.engine import Engine
from wavepp.kv_transfer.directory import DirectoryStore, TransferError
from wavepp.model_store import resolve_model
from wavepp.models import stage_specs

from .helpers import VOCAB, assert_clean

pytestmark = pytest.mark.slow


def wait_for(store: DirectoryStore, transfer_id: str, timeout_s: float = 10.0):
    """The transfer once every stage's part is there (the writers run beside execution)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return store.read(transfer_id)
        except TransferError as err:
            if err.reason != "incomplete" or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def exported_kv(
    transfer, num_layers: int, num_kv_heads: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per model layer (key, value) as transformers caches them: [1, kv_heads, tokens, head_dim]."""
    layers = {}
    for part in transfer.parts:
        tensors = load_file(str(part.path))
        for pool in ("key", "value"):
            for j, layer in enumerate(part.manifest["pools"][pool]["layers"]):
                rows = tensors[pool][j]  # [tokens, kv_heads * head_dim]
                layers.setdefault(layer, {})[pool] = rows.view(
                    rows.shape[0], num_kv_heads, -1
                ).transpose(0, 1)[None]
    assert sorted(layers) == list(range(num_layers))
    return [(layers[i]["key"], layers[i]["value"]) for i in range(num_layers)]


@pytest.fixture(scope="module")
def reference(tiny):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def smollm2_reference():
    path = resolve_model("smollm2")
    return path, transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("model, pp", [("tiny", 2), ("tiny", 3), ("smollm2", 2)])
def test_exported_kv_is_the_prompts_cache_and_decodes_as_the_prompt(request, tmp_path, model, pp):
    if model == "tiny":
        tiny, reference = request.getfixturevalue("tiny"), request.getfixturevalue("reference")
    else:
        tiny, reference = request.getfixturevalue("smollm2_reference")
    rng = random.Random(pp)
    prefix = [rng.randrange(VOCAB) for _ in range(70)]
    prompts = [prefix + [rng.randrange(VOCAB) for _ in range(n)] for n in (23, 9)]
    store_dir = tmp_path / "store"
    cfg = reference.config
    with Engine(
        str(tiny), pp=pp, dtype="float32", kv_store=str(store_dir), profile_waves=False
    ) as engine:
        first = engine.submit(prompts[0], kv_transfer=True).result(timeout=60)
        second = engine.submit(prompts[1], kv_transfer="second-one").result(timeout=60)
        assert second.num_cached_tokens == 64  # 4 full blocks of the shared 70 tokens reused
        assert second.kv_transfer["transfer_id"] == "second-one"
        store = DirectoryStore(store_dir)
        for prompt, result in zip(prompts, (first, second)):
            assert (
                result.kv_transfer["num_tokens"] == len(prompt)
                and result.kv_transfer["num_stages"] == pp
            )
            transfer = wait_for(store, result.kv_transfer["transfer_id"])
            assert transfer.token_ids == prompt
            assert [p.manifest["layers"] for p in transfer.parts] == [
                [s.start_layer, s.end_layer] for s in stage_specs(cfg.num_hidden_layers, pp)
            ]
            kv = exported_kv(transfer, cfg.num_hidden_layers, cfg.num_key_value_heads)
            ids = torch.tensor([prompt])
            with torch.no_grad():
                ref = reference(ids, use_cache=True).past_key_values
            for layer, (k, v) in enumerate(kv):  # reused blocks included: the whole prompt
                torch.testing.assert_close(k, ref.layers[layer].keys, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(v, ref.layers[layer].values, atol=1e-4, rtol=1e-4)
            # decode from the handed-off cache (all but the last token, which decode recomputes)
            cache = transformers.DynamicCache()
            for layer, (k, v) in enumerate(kv):
                cache.update(k[:, :, :-1].clone(), v[:, :, :-1].clone(), layer)
            with torch.no_grad():
                from_kv = reference.generate(ids, cache=cache, max_new_tokens=8, do_sample=False)
                from_prompt = reference.generate(ids, max_new_tokens=8, do_sample=False)
            assert from_kv.tolist() == from_prompt.tolist()
            assert from_kv[0, len(prompt)].item() == result.first_token_id
        assert_clean(engine)
        owned = sorted(p.name for p in store_dir.iterdir())
        assert len(owned) == 2
    assert list(store_dir.iterdir()) == []  # what the engine wrote goes with it


def test_a_poisoned_transfer_changes_the_decode(tiny, reference, tmp_path):
    """The decode really reads the handed-off cache: the same continuation from a corrupted
    copy differs, and the store's checksum catches the corruption."""
    rng = random.Random(7)
    prompt = [rng.randrange(VOCAB) for _ in range(40)]
    with Engine(
        str(tiny), pp=2, dtype="float32", kv_store=str(tmp_path), profile_waves=False
    ) as engine:
        result = engine.submit(prompt, kv_transfer="poison").result(timeout=60)
        store = DirectoryStore(tmp_path)
        transfer = wait_for(store, "poison")
        cfg = reference.config
        kv = exported_kv(transfer, cfg.num_hidden_layers, cfg.num_key_value_heads)
        ids = torch.tensor([prompt])
        cache = transformers.DynamicCache()
        for layer, (k, v) in enumerate(kv):
            cache.update(torch.randn_like(k[:, :, :-1]) * 10, v[:, :, :-1].clone(), layer)
        with torch.no_grad():
            poisoned = reference.generate(ids, cache=cache, max_new_tokens=8, do_sample=False)
            clean = reference.generate(ids, max_new_tokens=8, do_sample=False)
        assert poisoned.tolist() != clean.tolist()
        part = transfer.parts[1].path
        data = bytearray(part.read_bytes())
        data[-1] ^= 0xFF
        part.write_bytes(bytes(data))
        with pytest.raises(TransferError) as err:
            store.read("poison")
        assert err.value.reason == "corrupt"
        assert result.ok


def test_kv_transfer_refused_clearly(tiny, tmp_path):
    with Engine(str(tiny), pp=2, dtype="float32", profile_waves=False) as engine:
        with pytest.raises(ValueError, match="kv_store"):
            engine.submit([1, 2, 3], kv_transfer=True)
    with Engine(
        str(tiny), pp=2, dtype="float32", kv_store=str(tmp_path), profile_waves=False
    ) as engine:
        for bad in ("../escape", "", ".hidden", "a/b", 7):
            with pytest.raises(ValueError, match="transfer id|kv_transfer"):
                engine.submit([1, 2, 3], kv_transfer=bad)
        engine.submit([1, 2, 3], kv_transfer="taken").result(timeout=60)
        with pytest.raises(ValueError, match="in use"):
            engine.submit([4, 5, 6], kv_transfer="taken")
        # a prompt no stage can serve fails alone, and leaves no transfer behind
        failed = engine.submit([1] * 600, kv_transfer="too-long").result(timeout=60)
        assert not failed.ok and eventually(lambda: not (tmp_path / "too-long").exists())
        assert json.loads((tmp_path / "taken" / "request.json").read_text())["token_ids"] == [
            1,
            2,
            3,
        ]
        assert_clean(engine)


def _first_token(reference, prompt) -> int:
    with torch.no_grad():
        return int(reference(torch.tensor([prompt])).logits[0, -1].argmax())


def _plan(store, transfer_id, prompt, cfg):
    from wavepp.kv_transfer.decode_plan import plan_load

    return plan_load(
        store,
        transfer_id,
        prompt,
        block_size=16,
        num_computed=0,
        num_layers=cfg.num_hidden_layers,
        kv_width=cfg.num_key_value_heads * cfg.hidden_size // cfg.num_attention_heads,
    )


@pytest.mark.parametrize("policy", ["wavepp", "trtllm-pp"])
def test_a_failed_export_is_reported_and_never_loads(tiny, reference, tmp_path, policy):
    """Among concurrent hand-offs at PP = 3 (wavepp's loop, and an outside loop's), stage 1's part of one request cannot be written (a
    directory stands where its file goes, put there as stage 0 queues the request's part, before
    stage 1 runs it) and stage 0's part of another fails in its store (injected in this process,
    where stage 0 runs). Every answer's first token is right; the two failed ones say which
    stage failed and why (the answer waits for every stage's report); the counts reach the
    engine; the others are complete and load; the failed ones are refused with the reason."""
    rng = random.Random(11)
    names = ["good-a", "bad-stage1", "good-b", "bad-stage0", "good-c"]
    prompts = {
        name: [rng.randrange(VOCAB) for _ in range(40 + 7 * i)] for i, name in enumerate(names)
    }
    store_dir = tmp_path / "store"
    cfg = reference.config
    with Engine(
        str(tiny),
        pp=3,
        dtype="float32",
        kv_store=str(store_dir),
        profile_waves=False,
        policy=policy,
    ) as engine:
        exporter = engine._core.stage.exporter
        queue_part, write_part = exporter.submit, exporter.writer.store.write_part

        def submit(transfer_id, rows, num_tokens, request_id):
            if transfer_id == "bad-stage1":
                (store_dir / transfer_id / "stage1.safetensors").mkdir()
            queue_part(transfer_id, rows, num_tokens, request_id)

        def write(transfer_id, stage_id, data, manifest):
            if transfer_id == "bad-stage0":
                raise OSError(28, "No space left on device (injected)")
            write_part(transfer_id, stage_id, data, manifest)

        exporter.submit, exporter.writer.store.write_part = submit, write
        futures = {name: engine.submit(prompts[name], kv_transfer=name) for name in names}
        results = {name: fut.result(timeout=60) for name, fut in futures.items()}
        store = DirectoryStore(store_dir)
        for name, result in results.items():
            assert result.ok and result.first_token_id == _first_token(reference, prompts[name]), (
                name
            )
            transfer, plan = result.kv_transfer, _plan(store, name, prompts[name], cfg)
            if name.startswith("good"):
                assert "error" not in transfer, transfer
                # complete when the answer comes: no wait, every part there and good
                assert [p.stage_id for p in store.read(name).parts] == [0, 1, 2]
                assert plan.num_tokens == len(prompts[name]) - 1, plan  # all but the last token
            else:
                stage = int(name[-1])
                assert (
                    transfer["error"].startswith(f"stage {stage}: ")
                    and transfer["transfer_id"] == name
                )
                assert (
                    "Is a directory" if stage == 1 else "No space left on device (injected)"
                ) in transfer["error"]
                # the decode side refuses params with "error" at once; the store's mark follows,
                # written off the engine's lock
                assert eventually(lambda name=name: (store_dir / name / "failed.json").exists())
                plan = _plan(store, name, prompts[name], cfg)
                assert (
                    plan.num_tokens == 0
                    and f"stage {stage} could not write its part" in plan.reason
                ), plan
                with pytest.raises(TransferError) as err:
                    store.read(name)
                assert err.value.reason == "failed"
                left = sorted(f.name for f in (store_dir / name).iterdir())
                assert left == [".wavepp-transfer", "failed.json", "request.json"] + (
                    ["stage1.safetensors"] if stage == 1 else []
                ), left
        kv = exported_kv(store.read("good-b"), cfg.num_hidden_layers, cfg.num_key_value_heads)
        with torch.no_grad():
            ref = reference(torch.tensor([prompts["good-b"]]), use_cache=True).past_key_values
        torch.testing.assert_close(kv[-1][0], ref.layers[-1].keys, atol=1e-4, rtol=1e-4)
        assert engine.kv_export_counts() == (3 * len(names) - 2, 2)
        assert_clean(engine)


def hold_stage0_writes(engine, held_id: str) -> threading.Event:
    """Stage 0 (this process) writes transfer `held_id`'s part only once the event returned is
    set (at most a minute): a writer held mid-export."""
    store = engine._core.stage.exporter.writer.store
    write_part, release = store.write_part, threading.Event()

    def write(transfer_id, stage_id, data, manifest):
        if transfer_id == held_id:
            assert release.wait(60)
        write_part(transfer_id, stage_id, data, manifest)

    store.write_part = write
    return release


def test_the_store_cap_drops_the_oldest_transfer_while_its_stage_writes(tiny, reference, tmp_path):
    """A store capped below one transfer: the next request's submit drops the oldest, whose
    stage 0 is still writing (held here until then). That request's answer is right and says its
    part found the transfer gone; the newer one is complete and loads; the dropped one is refused
    (missing)."""
    rng = random.Random(12)
    prompts = {name: [rng.randrange(VOCAB) for _ in range(50)] for name in ("old", "new")}
    store_dir = tmp_path / "store"
    cfg = reference.config
    with Engine(
        str(tiny),
        pp=2,
        dtype="float32",
        kv_store=str(store_dir),
        kv_store_max_gib=100 / 2**30,
        profile_waves=False,
    ) as engine:
        release = hold_stage0_writes(engine, "old")
        old = engine.submit(prompts["old"], kv_transfer="old")
        new = engine.submit(
            prompts["new"], kv_transfer="new"
        )  # wakes the sweeper: "old" is over the cap
        assert eventually(lambda: not (store_dir / "old").exists())
        release.set()
        old, new = old.result(timeout=60), new.result(timeout=60)
        store = DirectoryStore(store_dir)
        assert old.first_token_id == _first_token(reference, prompts["old"])
        assert new.first_token_id == _first_token(reference, prompts["new"])
        assert "stage 0: KV transfer 'old' is missing" in old.kv_transfer["error"], old.kv_transfer
        assert (
            "error" not in new.kv_transfer
            and _plan(store, "new", prompts["new"], cfg).num_tokens == 49
        )
        refused = _plan(store, "old", prompts["old"], cfg)
        assert refused.num_tokens == 0 and "missing" in refused.reason
        written, failed = engine.kv_export_counts()
        assert written + failed == 4 and failed >= 1
        assert_clean(engine)


def test_a_stuck_writer_does_not_hold_the_answer(tiny, reference, tmp_path):
    """Stage 0's writer hangs on one transfer (held here), and with it every part queued behind
    it on that stage: both answers come `kv_export_wait_s` after the prefill, first tokens right,
    naming stage 0 as not reported; both transfers are refused (failed) even after the writer
    wakes and writes them late; a hand-off after it woke is whole."""
    rng = random.Random(13)
    prompts = {
        name: [rng.randrange(VOCAB) for _ in range(40)] for name in ("stuck", "behind", "later")
    }
    store_dir = tmp_path / "store"
    with Engine(
        str(tiny),
        pp=2,
        dtype="float32",
        kv_store=str(store_dir),
        profile_waves=False,
        kv_export_wait_s=1.0,
    ) as engine:
        release = hold_stage0_writes(engine, "stuck")
        t0 = time.perf_counter()
        futures = {
            name: engine.submit(prompts[name], kv_transfer=name) for name in ("stuck", "behind")
        }
        results = {name: fut.result(timeout=30) for name, fut in futures.items()}
        assert time.perf_counter() - t0 >= 1.0
        for name, result in results.items():
            assert result.first_token_id == _first_token(reference, prompts[name])
            assert result.kv_transfer["error"].startswith("stage 0: no report within 1 s"), (
                result.kv_transfer
            )
        release.set()
        later = engine.submit(prompts["later"], kv_transfer="later").result(timeout=30)
        assert "error" not in later.kv_transfer
        deadline = time.monotonic() + 30
        while sum(engine.kv_export_counts()) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.kv_export_counts() == (6, 0)  # the late parts were written and counted
        store = DirectoryStore(store_dir)
        for name in ("stuck", "behind"):
            with pytest.raises(TransferError) as err:
                store.read(name)
            assert err.value.reason == "failed"
        assert [p.stage_id for p in store.read("later").parts] == [0, 1]
        assert_clean(engine)


def test_mla_latents_exported_are_the_prompts_latent_cache(tmp_path):
    """DeepSeek-V3 (MLA): each stage exports its layers' latent rows [c | k_rope]; they are what
    transformers caches for the whole prompt (its MLA caches the normalized latent c as the
    layer's keys and the rotated RoPE key as its values), reused blocks included. (vLLM
    decoding from them: tests/connectors/test_pd_mla.py.)"""
    from wavepp.random_checkpoint import make_model

    path = make_model(tmp_path / "deepseek", arch="deepseek_v3", seed=3)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cfg = reference.config
    rng = random.Random(9)
    prefix = [rng.randrange(cfg.vocab_size) for _ in range(40)]
    prompts = [prefix + [rng.randrange(cfg.vocab_size) for _ in range(n)] for n in (11, 5)]
    store_dir = tmp_path / "store"
    with Engine(
        str(path),
        pp=2,
        dtype="float32",
        kv_store=str(store_dir),
        profile_waves=False,
        block_size=16,
    ) as engine:
        results = [engine.submit(p, kv_transfer=True).result(timeout=120) for p in prompts]
        assert results[1].num_cached_tokens == 32
        store = DirectoryStore(store_dir)
        rank, rope = cfg.kv_lora_rank, cfg.qk_rope_head_dim
        for prompt, result in zip(prompts, results):
            transfer = wait_for(store, result.kv_transfer["transfer_id"])
            latents = {}
            for part in transfer.parts:
                tensors = load_file(str(part.path))
                for j, layer in enumerate(part.manifest["pools"]["latent"]["layers"]):
                    latents[layer] = tensors["latent"][j]  # [tokens, rank + rope]
            assert sorted(latents) == list(range(cfg.num_hidden_layers))
            with torch.no_grad():
                ref = reference(torch.tensor([prompt]), use_cache=True).past_key_values
            for layer, rows in latents.items():
                assert rows.shape == (len(prompt), rank + rope)
                torch.testing.assert_close(
                    rows[:, :rank], ref.layers[layer].keys[0, 0], atol=1e-4, rtol=1e-4
                )
                torch.testing.assert_close(
                    rows[:, rank:], ref.layers[layer].values[0, 0], atol=1e-4, rtol=1e-4
                )
        assert_clean(engine)
