"""id_keys.walk_key (inlined by address into the layout's walk) writes a documentKey's
KeyString elements exactly as oplog_splice's `_ks_document_key` does, with the same type bits,
and on broken bytes gives up without writing past the room its caller gives it."""

from __future__ import annotations

from typing import Any

import bson
import numpy as np
from bson import Int64, ObjectId
from hypothesis import given, settings
from hypothesis import strategies as st

from buckets._columnar.byte_kernels import as_bytes
from buckets._columnar.id_keys import _BITS, _TS_TAIL_BITS, walk_key
from mongoformats.oplog_splice import _ks_document_key

_GUARD = 64  # bytes past the room walk_key is given, which it must leave as they are

_values = st.one_of(
    st.builds(ObjectId, st.binary(min_size=12, max_size=12)),
    st.text(max_size=12),
    st.integers(-(2**31), 2**31 - 1),
    st.builds(Int64, st.integers(-(2**62) + 1, 2**62 - 1)),
)
_names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=5)
_keys = st.recursive(
    st.dictionaries(_names, _values, min_size=1, max_size=4),
    lambda inner: st.dictionaries(_names, st.one_of(_values, inner), max_size=3),
    max_leaves=10,
)


def _walk(buf: bytes, start: int) -> tuple[int, np.ndarray, np.ndarray]:
    """walk_key over buf's documentKey at `start`: where its elements end, the output (with the
    guard), the stack."""
    out = np.full(2 * len(buf) + _GUARD, 0xAA, np.uint8)
    stack = np.zeros(_BITS + 2, np.int64)
    return walk_key(as_bytes(buf), start, out, 0, stack), out, stack


@settings(max_examples=300, deadline=None)
@given(_keys, st.binary(max_size=8), st.binary(max_size=8))
def test_walked_keys_are_the_general_splices_keys(
    key: dict[str, Any], before: bytes, after: bytes
) -> None:
    buf = before + bson.encode(key) + after
    bits: list[int] = []
    expected = _ks_document_key(buf, len(before), bits)
    end, out, stack = _walk(buf, len(before))
    if expected is None or len(bits) + _TS_TAIL_BITS > 50:
        return  # (the walk may take or leave what the general keys leave: the layout judges)
    assert end >= 0 and bytes(out[:end]) == expected[1:-1]
    assert stack[_BITS] == _TS_TAIL_BITS + len(bits)
    mask = sum(1 << (_TS_TAIL_BITS + i) for i, bit in enumerate(bits) if bit)
    assert stack[_BITS + 1] == mask


@settings(max_examples=300, deadline=None)
@given(_keys, st.data())
def test_broken_keys_are_left_without_writing_past_their_room(
    key: dict[str, Any], data: st.DataObject
) -> None:
    raw = bytearray(bson.encode(key))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(4, len(raw)))]
    end, out, _ = _walk(bytes(raw), 0)
    assert -1 <= end <= 2 * len(raw)
    assert bytes(out[2 * len(raw) :]) == b"\xaa" * _GUARD
