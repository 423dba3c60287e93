"""EventPublisher: a batch is queued or dropped and counted, never waited for; the queue's bound
holds while the thread is stuck; a subscriber that never reads holds nothing up; replay sends
what is buffered from the sequence number asked, then the end marker."""

import threading
import time

import msgspec
import pytest
import zmq

from wavepp.kv_events import KVEventsConfig, RemovedBlock
from wavepp.kv_events import publisher as publisher_module
from wavepp.kv_events.publisher import EventPublisher
from wavepp.kv_events.wire import END_SEQ
from wavepp.runtime.launch import free_port


def config(**fields) -> KVEventsConfig:
    return KVEventsConfig(
        enable_kv_cache_events=True, endpoint=f"tcp://*:{free_port()}", topic="t", **fields
    )


def subscriber(endpoint: str) -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(endpoint.replace("0.0.0.0", "127.0.0.1"))  # (a bound wildcard reads 0.0.0.0)
    sub.setsockopt_string(zmq.SUBSCRIBE, "t")
    time.sleep(0.3)  # the subscription reaches the publisher
    return sub


def test_the_queue_bound_holds_and_drops_are_counted(monkeypatch):
    gate = threading.Event()
    real = publisher_module.encode_batch

    def stuck(*args, **kwargs):
        gate.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(publisher_module, "encode_batch", stuck)
    replay = f"tcp://*:{free_port()}"
    pub = EventPublisher(config(max_queue_size=3, replay_endpoint=replay), block_size=4)
    try:
        assert pub.publish([RemovedBlock(0)])
        wait_until(lambda: pub.num_queued == 0)  # the thread took it, and waits
        t0 = time.perf_counter()
        accepted = [pub.publish([RemovedBlock(i)]) for i in range(1, 11)]
        assert time.perf_counter() - t0 < 2  # never waits for the stuck thread
        assert accepted == [True] * 3 + [False] * 7
        assert (pub.num_queued, pub.num_dropped, pub.num_published) == (3, 7, 0)
        gate.set()
        wait_until(lambda: pub.num_published == 4)
        got = [(seq, msgspec.msgpack.decode(payload)[1]) for seq, payload in ask_replay(replay, 0)]
        assert [seq for seq, _ in got] == [0, 1, 2, 3]  # sequence numbers count batches sent
        assert [events[0]["block_hashes"] for _, events in got] == [[0], [1], [2], [3]]
        assert (pub.num_published, pub.num_events, pub.num_dropped) == (4, 4, 7)
    finally:
        gate.set()
        pub.close()


def wait_until(condition, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def ask_replay(replay: str, first: int) -> list[tuple[int, bytes]]:
    """The batches the replay socket resends from `first` (the end marker checked, dropped)."""
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.connect(replay.replace("*", "127.0.0.1"))
    client.send_multipart((b"", first.to_bytes(8, "big")))
    frames = []
    while client.poll(10000):
        frames.append(client.recv_multipart())
        if frames[-1][2] == END_SEQ:
            break
    client.close(linger=0)
    assert frames and frames[-1] == [b"", b"", END_SEQ, b""]
    assert all(f[1] == b"t" for f in frames[:-1])
    return [(int.from_bytes(f[2], "big"), f[3]) for f in frames[:-1]]


def test_a_subscriber_that_never_reads_holds_nothing_up():
    pub = EventPublisher(config(hwm=10), block_size=4)
    sub = subscriber(pub.endpoint)  # connected, never reads
    try:
        t0 = time.perf_counter()
        for i in range(5000):
            assert pub.publish([RemovedBlock(i)])
        deadline = time.monotonic() + 20
        while pub.num_published < 5000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.num_published == 5000 and pub.num_dropped == 0
        assert time.perf_counter() - t0 < 20
    finally:
        pub.close()
        sub.close(linger=0)


def test_replay_sends_the_buffered_batches_from_the_number_asked_then_the_end_marker():
    replay = f"tcp://*:{free_port()}"
    pub = EventPublisher(config(replay_endpoint=replay, buffer_steps=3), block_size=4)
    try:
        for i in range(5):
            pub.publish([RemovedBlock(i)])
        wait_until(lambda: pub.num_published == 5)
        # batches 0 and 1 left the buffer (3 kept); 2, 3, 4 come back, then the marker
        assert [seq for seq, _ in ask_replay(replay, 1)] == [2, 3, 4]
        assert [seq for seq, _ in ask_replay(replay, 4)] == [4]
    finally:
        pub.close()


def test_a_taken_address_is_an_error_at_start():
    cfg = config()
    first = EventPublisher(cfg, block_size=4)
    try:
        with pytest.raises(zmq.ZMQError):
            EventPublisher(cfg, block_size=4)
    finally:
        first.close()


def test_open_names_the_option_when_the_address_is_taken():
    """EventPublisher.open (the Engine's, before any stage process starts): a port another
    socket holds is a ValueError naming kv_events and the endpoint, not a ZMQError."""
    cfg = config()
    taken = zmq.Context.instance().socket(zmq.PUB)
    taken.bind(cfg.endpoint)
    try:
        with pytest.raises(ValueError, match=r"kv_events: cannot open tcp://\*:\d+"):
            EventPublisher.open(cfg, 16)
    finally:
        taken.close(linger=0)
