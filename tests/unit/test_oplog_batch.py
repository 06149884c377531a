"""A reply's entries found by offset are the entries the element-by-element walk slices out."""

from __future__ import annotations

import struct

import bson
import pytest
from bson import Int64
from hypothesis import given, settings
from hypothesis import strategies as st

from buckets._columnar.oplog_batch import SLACK, batch_in_place, reply_batch
from mongoformats.oplog_splice import cursor_batch


def _reply(docs: list[dict], first: bool = False, cursor_id: int = 7) -> bytes:
    batch = "firstBatch" if first else "nextBatch"
    return bson.encode(
        {"cursor": {batch: docs, "id": Int64(cursor_id), "ns": "local.oplog.rs"}, "ok": 1.0}
    )


# Sizes across the keys' widths (0-9, 10-99, 100-999, 1000-...): each width is its own stretch
# of the walk.
@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 1001, 1500]),
    st.integers(0, 40),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
)
def test_a_batch_of_any_size_is_found_entry_for_entry(
    n: int, pad: int, first: bool, cursor_id: int
) -> None:
    reply = _reply([{"i": i, "s": "x" * ((i * 7 + pad) % 50)} for i in range(n)], first, cursor_id)
    got_id, batch = reply_batch(reply)
    assert (got_id, batch.entries()) == cursor_batch(reply)
    assert len(batch) == n
    # A reply received into a buffer of its own (a bytearray) gives its entries as bytes too.
    _, in_place = batch_in_place(bytearray(reply + bytes(SLACK)), 0)
    entries = in_place.entries()
    assert entries == batch.entries() and all(type(e) is bytes for e in entries)
    assert in_place.entries(n // 2) == entries[n // 2 :]
    if n:
        assert batch.entry(-1) == bson.encode({"i": n - 1, "s": "x" * (((n - 1) * 7 + pad) % 50)})


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 30), st.data())
def test_broken_bytes_raise_or_give_what_the_element_walk_gives(
    n: int, data: st.DataObject
) -> None:
    """A changed byte anywhere (a length, a key, a type): the walk ends, and either raises or finds
    exactly the entries the element-by-element walk finds, and never a batch with a wrong key."""
    reply = bytearray(_reply([{"i": i} for i in range(n)]))
    for _ in range(data.draw(st.integers(1, 3))):
        reply[data.draw(st.integers(0, len(reply) - 1))] = data.draw(st.integers(0, 255))
    try:
        got = reply_batch(bytes(reply))
    except (ValueError, KeyError, IndexError, struct.error):
        return
    expected = cursor_batch(bytes(reply))
    assert (got[0], got[1].entries()) == expected


def test_an_array_keyed_otherwise_is_refused() -> None:
    reply = bytearray(_reply([{"i": 0}, {"i": 1}]))
    at = reply.index(b"\x031\x00")
    reply[at + 1] = ord("7")
    with pytest.raises(ValueError, match="keyed 0, 1"):
        reply_batch(bytes(reply))
    reply[at] = 0x10  # an int32 where a document must be
    with pytest.raises(ValueError):
        reply_batch(bytes(reply))
