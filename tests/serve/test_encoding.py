"""json_bytes writes exactly what json.dumps writes, whatever the split into pieces."""

import gc
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wavepp.serve import encoding
from wavepp.serve.encoding import gc_paused, json_bytes


def _reference(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_keys = (
    st.text(max_size=6)
    | st.integers(-99, 99)
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, allow_infinity=False)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=7) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(value=_values, budget=st.integers(1, 12))
def test_same_bytes_as_json_dumps_for_any_split(value, budget):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(encoding, "PIECE_ITEMS", budget)
        assert json_bytes(value) == _reference(value)


def test_a_large_answer_goes_out_in_pieces(monkeypatch):
    # the shape of a real answer: choices of per-position top-k dicts, far past one piece
    answer = {
        "choices": [
            {
                "index": i,
                "text": "é" * 50,
                "logprobs": {
                    "top_logprobs": [{f"t{j}": -j / 7 for j in range(20)} for _ in range(300)]
                },
            }
            for i in range(4)
        ]
    }
    calls = []
    real = encoding._dumps
    monkeypatch.setattr(encoding, "_dumps", lambda v: calls.append(v) or real(v))
    assert json_bytes(answer) == _reference(answer)
    assert len(calls) > 4, "the answer was serialized in one call"
    assert all(
        encoding._room(v, encoding.PIECE_ITEMS) >= 0 for v in calls if isinstance(v, (dict, list))
    ), "a piece held more than PIECE_ITEMS items"


def test_what_json_refuses_it_refuses():
    with pytest.raises(ValueError):
        json_bytes({"x": [math.nan] * 10_000})


def test_gc_paused_nests_and_restores():
    assert gc.isenabled()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
