"""Objects on the planes: one fixed-size message when the pickle fits, a second one for the
rest when it does not, and the same object out as in, over real gloo between two processes."""

import pickle

import pytest
import torch.multiprocessing as mp

from wavepp.runtime.channels import INLINE_BYTES, Channels, pack_obj, rest_size, unpack_obj
from wavepp.runtime.launch import free_port


def pickled_size(obj) -> int:
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def bytes_pickling_to(size: int) -> bytes:
    """A bytes object whose pickle is exactly `size` bytes."""
    n = size
    while pickled_size(b"x" * n) > size:
        n -= 1
    assert pickled_size(b"x" * n) == size
    return b"x" * n


@pytest.mark.parametrize("extra, num_messages", [(0, 1), (1, 2), (3 * INLINE_BYTES, 2)])
def test_an_object_takes_one_message_while_its_pickle_fits(extra, num_messages):
    obj = bytes_pickling_to(INLINE_BYTES - 8 + extra)
    parts = pack_obj(obj)
    assert len(parts) == num_messages and parts[0].numel() == INLINE_BYTES
    assert rest_size(parts[0]) == (parts[1].numel() if num_messages == 2 else 0) == extra
    assert unpack_obj(*parts, *([None] if num_messages == 1 else [])) == obj


def test_a_truncated_second_message_is_an_error_not_a_wrong_object():
    parts = pack_obj(list(range(5000)))
    with pytest.raises(ValueError, match="arrived with"):
        unpack_obj(parts[0], parts[1][:-1])


OBJECTS = [
    None,
    {"wave": 7, "chunks": [(0, 64)] * 3},
    list(range(20_000)),
    "",
    b"\0" * (INLINE_BYTES - 8),
]


def _peer(rank: int, port: int, queue) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    channels = Channels(rank, 2)
    try:
        if rank == 0:  # (a gloo send returns once the peer receives: one object at a time)
            echoed = []
            for obj in OBJECTS:
                channels.send_obj(obj, 1, "rounds")
                echoed.append(channels.recv_obj(1, "replies"))
            queue.put(echoed)
        else:
            for _ in OBJECTS:
                channels.send_obj(channels.recv_obj(0, "rounds"), 0, "replies")
    finally:
        channels.close()


def test_objects_cross_two_processes_over_gloo_unchanged():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_peer, args=(rank, port, queue)) for rank in range(2)]
    for p in procs:
        p.start()
    echoed = queue.get(timeout=60)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert echoed == OBJECTS
