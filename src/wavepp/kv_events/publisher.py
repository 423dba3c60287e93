"""The ZeroMQ side of KV cache events: a PUB socket for the stream, a ROUTER socket for replay,
and the thread that owns both.

    publisher = EventPublisher(config, block_size)   # sockets bound / connected here
    publisher.publish(events)    # never blocks: queued, or dropped and counted when full
    publisher.close()            # the thread sends what is queued (at most CLOSE_WAIT_S), ends

The caller hands a batch over and goes on: a bounded queue (`max_queue_size` batches) lies
between it and the thread that encodes and sends (wire.py), so a subscriber that reads slowly
or not at all never holds the engine. Past the queue's bound new batches are dropped and
counted (`num_dropped`); past the PUB socket's high-water mark ZeroMQ drops messages for that
subscriber. The last `buffer_steps` batches are kept, encoded, for replay: a subscriber that
missed some sends the first sequence number it wants and gets every buffered batch from there
on, then the end marker. Sequence numbers count batches sent, from 0 (a dropped batch takes
none, as it never went out).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

import zmq

from wavepp.kv_events.config import KVEventsConfig
from wavepp.kv_events.wire import END_SEQ, encode_batch

CLOSE_WAIT_S = 1.0
_POLL_S = 0.05  # how often the thread looks at the replay socket while nothing is queued


class EventPublisher:
    @classmethod
    def open(cls, events: KVEventsConfig | None, block_size: int) -> "EventPublisher":
        """A publisher with its sockets open; an address that cannot be bound or connected is a
        ValueError naming the option."""
        if events is None:
            raise ValueError("kv_events: no configuration to publish with")
        try:
            return cls(events, block_size)
        except zmq.ZMQError as exc:
            raise ValueError(
                f"kv_events: cannot open {events.endpoint} (or replay "
                f"{events.replay_endpoint}): {exc}"
            ) from None

    def __init__(self, config: KVEventsConfig, block_size: int, data_parallel_rank: int = 0):
        """Open the sockets (a bad or taken address raises zmq.ZMQError here) and start the
        thread."""
        self.config, self.block_size, self.data_parallel_rank = (
            config,
            block_size,
            data_parallel_rank,
        )
        self._queue: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode()
        self._context: zmq.Context = zmq.Context.instance()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay: zmq.Socket | None = None
        try:
            self.endpoint = _open(self._pub, config.endpoint, bind=_binds(config.endpoint))
            self.replay_endpoint = None
            if config.replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self.replay_endpoint = _open(self._replay, config.replay_endpoint, bind=True)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self.num_published = 0  # batches sent (the next batch's sequence number)
        self.num_events = 0  # events in them
        self.num_dropped = 0  # batches dropped: the queue was full
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kv-events-pub", daemon=True)
        self._thread.start()

    def publish(self, events: list) -> bool:
        """Queue one batch of events (AllStageBlocks' records); False (and counted) when the
        queue is full. Never blocks."""
        if not events:
            return True
        try:
            self._queue.put_nowait((time.time(), events))
        except queue.Full:
            self.num_dropped += 1
            return False
        return True

    @property
    def num_queued(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        """Send what is queued (at most CLOSE_WAIT_S), stop the thread, close the sockets."""
        self._stopping = True
        self._thread.join(timeout=CLOSE_WAIT_S)
        if not self._thread.is_alive():
            self._close_sockets()

    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._answer_replay()
            try:
                ts, events = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if self._stopping:
                    return
                continue
            payload = encode_batch(
                ts, events, self.block_size, data_parallel_rank=self.data_parallel_rank
            )
            seq = self.num_published
            try:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            except zmq.ZMQError:  # (a connected PUB whose peer is gone): this batch is lost
                self.num_dropped += 1
                continue
            self._buffer.append((seq, payload))
            self.num_published = seq + 1
            self.num_events += len(events)

    def _answer_replay(self) -> None:
        """One replay request: [identity, b"", first sequence number]; anything else is ignored."""
        replay = self._replay
        assert replay is not None
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            return
        identity, first = frames[0], int.from_bytes(frames[2], "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                replay.send_multipart((identity, b"", self._topic, seq.to_bytes(8, "big"), payload))
        replay.send_multipart((identity, b"", b"", END_SEQ, b""))

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)


def _binds(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard address (and ipc:// or inproc://), connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _open(sock: zmq.Socket, endpoint: str, *, bind: bool) -> str:
    """Bind or connect `sock`; the address it has (a bound port 0 resolved)."""
    if not bind:
        sock.connect(endpoint)
        return endpoint
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
