"""Chained block hashes: prefix property, keys, partial blocks, determinism, speed."""

import statistics
import subprocess
import sys
import time

import numpy as np
import pytest

from wavepp.cache import hash_blocks

B = 4


def test_one_hash_per_full_block_partial_block_has_none():
    assert hash_blocks([], B) == []
    assert hash_blocks([1, 2, 3], B) == []
    assert len(hash_blocks(list(range(8)), B)) == 2
    assert len(hash_blocks(list(range(11)), B)) == 2
    assert hash_blocks(list(range(11)), B) == hash_blocks(list(range(8)), B)


def test_same_prefix_same_hashes():
    a = hash_blocks([7] * 8 + [1, 2, 3, 4], B)
    b = hash_blocks([7] * 8 + [5, 6, 7, 8, 9], B)
    assert a[:2] == b[:2] and a[2] != b[2]


def test_changed_token_changes_that_block_and_every_later_one():
    tokens = list(range(20))
    base = hash_blocks(tokens, B)
    changed = hash_blocks(tokens[:9] + [999] + tokens[10:], B)  # token 9 is in block 2
    assert changed[:2] == base[:2]
    assert all(x != y for x, y in zip(changed[2:], base[2:]))


def test_equal_blocks_at_different_positions_hash_differently():
    hashes = hash_blocks([3, 3, 3, 3] * 3, B)
    assert len(set(hashes)) == 3


def test_extra_keys_and_salt_change_every_hash():
    tokens = list(range(12))
    base = hash_blocks(tokens, B)
    keyed = hash_blocks(tokens, B, extra_keys=b"lora-1")
    salted = hash_blocks(tokens, B, salt=b"tenant-a")
    for other in (keyed, salted):
        assert all(x != y for x, y in zip(base, other))
    assert hash_blocks(tokens, B, extra_keys=b"ab") != hash_blocks(
        tokens, B, extra_keys=b"a", salt=b"b"
    )
    assert hash_blocks(tokens, B, salt=b"tenant-a") == salted


def test_parent_continues_a_chain():
    tokens = list(range(24))
    whole = hash_blocks(tokens, B, salt=b"s")
    head = hash_blocks(tokens[:8], B, salt=b"s")
    tail = hash_blocks(tokens[8:], B, salt=b"s", parent=head[-1])
    assert head + tail == whole


def test_list_and_arrays_of_any_int_dtype_agree():
    tokens = [5, 150_000, 0, 31, 2**31 - 1, 17, 9, 9]
    expected = hash_blocks(tokens, B)
    for dtype in (np.int32, np.int64, np.uint32):
        assert hash_blocks(np.array(tokens, dtype=dtype), B) == expected


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="block_size"):
        hash_blocks([1, 2], 0)
    with pytest.raises(ValueError, match="integers"):
        hash_blocks(np.array([1.0, 2.0]), 1)
    with pytest.raises(ValueError, match="1-D"):
        hash_blocks(np.zeros((2, 4), dtype=np.int64), B)


def test_same_hashes_in_another_process():
    code = "from wavepp.cache import hash_blocks; print(hash_blocks(list(range(40)), 4, salt=b'x'))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(hash_blocks(list(range(40)), 4, salt=b"x"))


def test_32k_token_prompt_hashes_in_well_under_a_millisecond():
    tokens = np.random.default_rng(0).integers(0, 150_000, size=32_768, dtype=np.int64)
    as_list = tokens.tolist()
    hash_blocks(tokens, 16)  # warm up
    array_s = statistics.median(_timed(lambda: hash_blocks(tokens, 16)) for _ in range(9))
    list_s = statistics.median(_timed(lambda: hash_blocks(as_list, 16)) for _ in range(5))
    print(
        f"\n32k tokens, block 16: numpy array {array_s * 1e6:.0f} us, list {list_s * 1e6:.0f} us (median)"
    )
    assert array_s < 2e-3


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
