"""A hand-off whose export fails, over HTTP: the prefill's answer is still right and says which
stage's part failed and why in its kv_transfer_params; one that succeeds is complete in the
store when its answer comes; /metrics counts the parts by outcome.

The server runs in this process over a real Engine (the tiny byte-level Llama, PP = 2), so the
fault is injected where stage 0 runs: its store's write fails while `fail` is set."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.serve.conftest import app_in_thread
from wavepp.engine import Engine
from wavepp.kv_transfer import DirectoryStore, TransferError
from wavepp.serve import ServeConfig, build_app

HAND_OFF = {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    store = tmp_path_factory.mktemp("kv")
    engine = Engine(str(tiny_model), pp=2, dtype="float32", kv_store=str(store), profile_waves=False)
    fail = threading.Event()
    exporter = engine._core.stage.exporter
    write_part = exporter.store.write_part

    def write(transfer_id, stage_id, data, manifest):
        if fail.is_set():
            raise OSError(28, "No space left on device (injected)")
        write_part(transfer_id, stage_id, data, manifest)

    exporter.store.write_part = write
    try:
        with app_in_thread(build_app(engine, ServeConfig("tiny"))) as url:
            yield url, DirectoryStore(store), fail, engine
    finally:
        engine.shutdown()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


def test_a_failed_part_is_reported_in_the_answer_and_the_metrics(served):
    url, store, fail, engine = served
    bodies = {"/v1/completions": {"prompt": [5, 6, 7] * 20}, "/v1/chat/completions": {"messages": MESSAGES}}
    answers = {}
    for failing in (False, True):
        if failing:
            fail.set()
        else:
            fail.clear()
        for path, body in bodies.items():
            r = httpx.post(f"{url}{path}", json={**body, **HAND_OFF}, timeout=60)
            assert r.status_code == 200, r.text
            answers[path, failing] = r.json()
    fail.clear()
    for path in bodies:
        ok, failed = answers[path, False], answers[path, True]
        text = "text" if path == "/v1/completions" else "message"
        assert failed["choices"][0][text] == ok["choices"][0][text]     # the first token does not change
        params = ok["kv_transfer_params"]
        assert "error" not in params and len(store.read(params["transfer_id"]).parts) == 2   # whole, at once
        params = failed["kv_transfer_params"]
        assert params["error"] == "stage 0: [Errno 28] No space left on device (injected)", params
        with pytest.raises(TransferError) as err:
            store.read(params["transfer_id"])
        assert err.value.reason == "failed" and "No space left on device" in str(err.value)
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert _metric(metrics, 'wavepp_kv_exports_total{outcome="written"}') == 6     # 4 answers x 2 stages - 2
    assert _metric(metrics, 'wavepp_kv_exports_total{outcome="failed"}') == 2
    assert _metric(metrics, 'wavepp_requests_total{outcome="ok"}') == 4
    assert engine.kv_export_counts() == (6, 2)
