"""A hand-off whose export fails, over HTTP: the prefill's answer is still right and says which
stage's part failed and why in its kv_transfer_params; one that succeeds is complete in the
store when its answer comes; /metrics counts the parts by outcome.

The server runs in this process over a real Engine (the tiny byte-level Llama, PP = 2), so the
fault is injected where stage 0 runs: its store's write fails while `fail` is set."""

from __future__ import annotations

import errno
import threading

import httpx
import pytest

from tests.eventually import eventually
from tests.serve.conftest import app_in_thread
from wavepp.engine import Engine
from wavepp.kv_transfer.directory import DirectoryStore, TransferError
from wavepp.serve import ServeConfig, build_app

HAND_OFF = {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    store = tmp_path_factory.mktemp("kv")
    engine = Engine(
        str(tiny_model), pp=2, dtype="float32", kv_store=str(store), profile_waves=False
    )
    fail = threading.Event()
    exporter = engine._core.stage.exporter
    write_part = exporter.writer.store.write_part

    def write(transfer_id, stage_id, data, manifest):
        if fail.is_set():
            raise OSError(28, "No space left on device (injected)")
        write_part(transfer_id, stage_id, data, manifest)

    exporter.writer.store.write_part = write
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


def _reason(store, transfer_id):
    try:
        store.read(transfer_id)
    except TransferError as err:
        return err.reason
    return "complete"


def test_a_failed_part_is_reported_in_the_answer_and_the_metrics(served):
    url, store, fail, engine = served
    bodies = {
        "/v1/completions": {"prompt": [5, 6, 7] * 20},
        "/v1/chat/completions": {"messages": MESSAGES},
    }
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
        assert (
            failed["choices"][0][text] == ok["choices"][0][text]
        )  # the first token does not change
        params = ok["kv_transfer_params"]
        assert (
            "error" not in params and len(store.read(params["transfer_id"]).parts) == 2
        )  # whole, at once
        params = failed["kv_transfer_params"]
        assert params["error"] == "stage 0: [Errno 28] No space left on device (injected)", params
        # the answer's "error" is what the decode side reads first; the store's mark follows
        # off the engine's lock (the sweeper)
        assert eventually(lambda params=params: _reason(store, params["transfer_id"]) == "failed")
        with pytest.raises(TransferError) as err:
            store.read(params["transfer_id"])
        assert "No space left on device" in str(err.value)
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert (
        _metric(metrics, 'wavepp_kv_exports_total{outcome="written"}') == 6
    )  # 4 answers x 2 stages - 2
    assert _metric(metrics, 'wavepp_kv_exports_total{outcome="failed"}') == 2
    assert _metric(metrics, 'wavepp_requests_total{outcome="ok"}') == 4
    assert engine.kv_export_counts() == (6, 2)


def test_the_answer_names_no_server_path(served):
    url, store, _, _ = served
    r = httpx.post(f"{url}/v1/completions", json={"prompt": [5, 6, 7] * 5, **HAND_OFF}, timeout=60)
    params = r.json()["kv_transfer_params"]
    assert set(params) == {"transfer_id", "num_tokens", "num_stages", "block_size"}
    assert str(store.root) not in r.text and "store" not in params


def test_a_full_disk_still_answers_and_leaves_no_folder(served, monkeypatch):
    """The store cannot take the transfer's request.json: the prompt is prefilled all the same,
    its params say why there is no hand-off (the decode side computes the prompt), and nothing
    is left in the store (it was a 500 and an empty folder per request)."""
    url, store, _, engine = served
    before = sorted(p.name for p in store.root.iterdir())
    ok = httpx.post(
        f"{url}/v1/completions", json={"prompt": [5, 6, 7] * 5, "max_tokens": 1}, timeout=60
    ).json()
    from wavepp.kv_transfer.directory import store as store_module

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module, "_write_atomic", full)
    for _ in range(3):
        r = httpx.post(
            f"{url}/v1/completions", json={"prompt": [5, 6, 7] * 5, **HAND_OFF}, timeout=60
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == ok["choices"][0]["text"]
        assert r.json()["kv_transfer_params"] == {
            "error": "the KV store could not take the transfer: No space left on device"
        }
    assert sorted(p.name for p in store.root.iterdir()) == before


def test_a_transfer_given_up_is_dropped_and_nothing_else_is(served):
    url, store, _, _ = served
    (store.root / "my-notes").mkdir(exist_ok=True)
    r = httpx.post(f"{url}/v1/completions", json={"prompt": [5, 6, 7] * 5, **HAND_OFF}, timeout=60)
    transfer_id = r.json()["kv_transfer_params"]["transfer_id"]
    assert (store.root / transfer_id).is_dir()
    gone = httpx.delete(f"{url}/v1/kv_transfers/{transfer_id}", timeout=10)
    assert gone.status_code == 200 and gone.json() == {
        "id": transfer_id,
        "object": "kv_transfer",
        "deleted": True,
    }
    assert eventually(lambda: not (store.root / transfer_id).exists())
    for name in (transfer_id, "my-notes", ".hidden", "x" * 300):
        r = httpx.delete(f"{url}/v1/kv_transfers/{name}", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", (
            name,
            r.text,
        )
    assert (store.root / "my-notes").is_dir()


def test_a_decode_side_that_is_down_leaves_no_transfer_behind(served):
    """`wavepp route` in front of this server and a decode address nothing listens on: each
    request is a 502 naming no address, and the transfer its prefill wrote is dropped at once
    (it stayed until its TTL: 20 requests left 79.6 MiB)."""
    from tests.serve.conftest import free_port
    from wavepp.route.config import RouteConfig
    from wavepp.route.router import RequestRouter

    url, store, _, _ = served

    def transfers():
        return {p.name for p in store.root.iterdir() if (p / ".wavepp-transfer").exists()}

    before = transfers()
    dead = f"http://127.0.0.1:{free_port()}"
    with app_in_thread(RequestRouter(RouteConfig(url, dead, timeout_s=30)).app) as router:
        for i in range(4):
            r = httpx.post(
                f"{router}/v1/completions",
                json={"prompt": [5, 6, 7 + i] * 10, "max_tokens": 4},
                timeout=60,
            )
            assert r.status_code == 502, r.text
            assert "decode server" in r.json()["error"]["message"] and "127.0.0.1" not in r.text
    assert eventually(lambda: transfers() == before), transfers() - before


def test_the_store_shows_in_the_metrics(served):
    """/metrics shows the store's cap (the default: half the free space), its bytes as of the
    last sweep, and the transfers swept, read without scanning the store at the scrape."""
    url, _, _, engine = served
    r = httpx.post(f"{url}/v1/completions", json={"prompt": [9, 8, 7] * 5, **HAND_OFF}, timeout=60)
    assert r.status_code == 200

    def scraped(name):
        return _metric(httpx.get(f"{url}/metrics", timeout=10).text, name)

    usage = engine.kv_transfer_usage()
    assert scraped("wavepp_kv_store_max_bytes") == usage.store_max_bytes > 2**20
    assert eventually(lambda: scraped("wavepp_kv_store_bytes") > 0)
    assert scraped("wavepp_kv_transfers_swept_total") == engine.kv_transfer_usage().num_swept
