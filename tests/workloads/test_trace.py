"""Mooncake trace replay: blocks per hash id, scaled last block, timestamps, clear errors."""

import json
from pathlib import Path

import pytest

from wavepp.workloads import trace
from wavepp.workloads.registry import DEFAULT_MOONCAKE_TRACE


def write(tmp_path, records, extra_lines=()):
    path = tmp_path / "t.jsonl"
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


RECORDS = [
    {"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2]},
    {"timestamp": 500, "input_length": 600, "output_length": 3, "hash_ids": [1, 3]},
    {"timestamp": 1500, "input_length": 100, "output_length": 3, "hash_ids": [2]},
]


def test_each_hash_id_is_one_deterministic_block_and_the_last_block_scales(tmp_path):
    w = trace(write(tmp_path, RECORDS), tokens_per_block=8, block_size=8, time_scale=2.0)
    a, b, c = w.prompts
    # last blocks: 488 -> round(7.6) = 8 tokens; 88 -> round(1.4) = 1; 100 -> round(1.6) = 2
    assert [len(a), len(b), len(c)] == [16, 9, 2]
    assert a[:8] == b[:8]  # shared id 1
    assert b[8:] != a[8:9]  # ids 2 and 3 differ
    assert c == a[8:10]  # id 2 again: the same tokens (a prefix of its block)
    assert w.arrival_times_s == (0.0, 1.0, 3.0)
    # request b reuses block 1 (capped at (9-1)//8*8 = 8); c's block 2 sits at a new position
    assert w.ideal_hit_rate == pytest.approx(8 / 27)
    assert trace(write(tmp_path, RECORDS), tokens_per_block=8).prompts == w.prompts


def test_max_requests_and_full_scale(tmp_path):
    w = trace(write(tmp_path, RECORDS), max_requests=2)
    assert [len(p) for p in w.prompts] == [1000, 600]


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"timestamp": 1, "input_length": 10}), "missing field 'hash_ids'"),
        (json.dumps({"timestamp": 1, "input_length": 2000, "hash_ids": [5]}), "does not fit"),
        (json.dumps({"timestamp": -1, "input_length": 10, "hash_ids": [5]}), "timestamp"),
    ],
)
def test_malformed_lines_are_reported_with_their_line_number(tmp_path, bad, message):
    path = write(tmp_path, RECORDS[:1], [bad])
    with pytest.raises(ValueError, match=message) as info:
        trace(path)
    assert f"{path}:2:" in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="trace file not found"):
        trace(tmp_path / "absent.jsonl")


@pytest.mark.skipif(not Path(DEFAULT_MOONCAKE_TRACE).is_file(), reason="Mooncake trace not present")
def test_published_trace_first_request_has_its_input_length():
    w = trace(DEFAULT_MOONCAKE_TRACE, max_requests=20, block_size=512)
    assert len(w.prompts[0]) == 40160
    assert list(w.arrival_times_s) == sorted(w.arrival_times_s)
