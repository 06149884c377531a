"""A reply's entries found by offset are the entries the element-by-element walk slices out."""

from __future__ import annotations

import struct

import bson
import numpy as np
import pytest
from bson import Int64
from hypothesis import given, settings
from hypothesis import strategies as st

from buckets._columnar.oplog_batch import SLACK, OplogBatch, batch_in_place, reply_batch, starts_of
from mongoformats.oplog_splice import cursor_batch, not_crud


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


def _entry(op: str, lsid: bool, number: bool, extra: int) -> bytes:
    doc: dict = {}
    if lsid:
        doc["lsid"] = {"id": bson.Binary(bytes(16), 4), "uid": bson.Binary(bytes(32), 0)}
    if number:
        doc["txnNumber"] = Int64(3)
    doc |= {"op": op, "ns": "db.c", "o": {"x": "y" * extra}}
    return bson.encode(doc)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["i", "u", "d", "c", "n", "x", "ii", ""]),
            st.booleans(),
            st.booleans(),
            st.integers(0, 30),
        ),
        min_size=1,
        max_size=12,
    ),
    st.data(),
)
def test_commands_are_told_apart_in_place_as_not_crud_tells_them(
    shapes: list[tuple[str, bool, bool, int]], data: st.DataObject
) -> None:
    """OplogBatch.not_crud of any entries (a session's or not, any op, short or broken ones, an
    lsid's length pointing anywhere) is what oplog_splice.not_crud says of each."""
    entries = [_entry(*shape) for shape in shapes]
    for k in range(len(entries)):
        raw = bytearray(entries[k])
        for _ in range(data.draw(st.integers(0, 2))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        if data.draw(st.booleans()):
            raw = raw[: data.draw(st.integers(0, len(raw)))]
        entries[k] = bytes(raw)
    # In a reply's buffer (entries back to back, SLACK after the last) and as bytes.
    joined = b"".join(entries) + bytes(SLACK)
    lengths = np.fromiter(map(len, entries), np.int64, len(entries))
    batch = OplogBatch(bytearray(joined), starts_of(lengths), lengths)
    which = data.draw(st.lists(st.integers(0, len(entries) - 1), unique=True)) or [0]
    picked = batch.entries_at(which)
    assert batch.not_crud(which, picked) == [not_crud(e) for e in picked]
    assert OplogBatch.of(entries).not_crud([], []) == []


def test_an_lsid_whose_length_points_outside_its_entry_is_read_one_by_one() -> None:
    raw = bytearray(_entry("c", True, True, 5))
    for length in (-20, -11, 0, len(raw), 1 << 30):
        raw[10:14] = struct.pack("<i", length)
        batch = OplogBatch.of([bytes(raw)])
        assert batch.not_crud([0], [bytes(raw)]) == [not_crud(bytes(raw))]
