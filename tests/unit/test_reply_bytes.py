"""A reply's head and tail written from their parts (mongoformats/bson_bytes.py
`plain_elements`, `cursor_document`, `document_parts`) are bson.encode's bytes, and bson.encode's
errors, for any values: the types written directly and everything handed to bson.encode."""

from __future__ import annotations

import datetime

import bson
import pytest
from bson import Binary, Int64, Timestamp
from bson.errors import InvalidDocument
from bson.raw_bson import RawBSONDocument
from hypothesis import given, settings
from hypothesis import strategies as st

from mongoformats.bson_bytes import cursor_document, document_parts, plain_elements

_keys = st.one_of(
    st.sampled_from(["_id", "ok", "$clusterTime", "operationTime", "postBatchResumeToken"]),
    st.text(max_size=6),  # may hold a NUL or a lone surrogate: bson.encode refuses those
)
_scalars = st.one_of(
    st.text(max_size=20),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),  # int32, int64 and out of range
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1).map(Int64),
    st.floats(allow_nan=True),
    st.booleans(),
    st.builds(Timestamp, st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1)),
    st.builds(Binary, st.binary(max_size=12), st.sampled_from([0, 2, 4])),
    st.none(),  # not written directly: bson.encode's
    st.datetimes(max_value=datetime.datetime(9000, 1, 1)),
    st.dictionaries(st.sampled_from("abc"), st.integers(-9, 9), max_size=3).map(
        lambda d: RawBSONDocument(bson.encode(d))
    ),
)
_values = st.recursive(_scalars, lambda v: st.dictionaries(_keys, v, max_size=4), max_leaves=8)
_documents = st.dictionaries(_keys, _values, max_size=5)


def _encoded(encode, doc):  # noqa: ANN001, ANN202
    """`encode(doc)`, or the type of the error it raised."""
    try:
        return encode(doc)
    except (InvalidDocument, OverflowError, UnicodeEncodeError) as exc:
        return type(exc)


@settings(max_examples=400)
@given(_documents)
def test_plain_elements_are_bson_encode_s_bytes_and_errors(doc):  # noqa: ANN001
    assert _encoded(plain_elements, doc) == _encoded(lambda d: bson.encode(d)[4:-1], doc)


@settings(max_examples=200)
@given(
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.text(max_size=40),
    st.text(alphabet="0123456789ABCDEF", max_size=60),
    st.builds(Timestamp, st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1)),
)
def test_a_small_reply_is_bson_encode_s_bytes(cursor_id, ns, data, op_time):  # noqa: ANN001
    """A getMore reply as the proxy sends it: the cursor, ok, the gossiped $clusterTime (raw, as
    mongos sent it) and operationTime."""
    events = [bson.encode({"_id": {"_data": data}, "n": i}) for i in range(3)]
    token = {"_data": data}
    signed = {"clusterTime": op_time, "signature": {"hash": Binary(b"h" * 20), "keyId": Int64(0)}}
    cursor = cursor_document(cursor_id, ns, "nextBatch", events, {"postBatchResumeToken": token})
    reply = {"cursor": cursor, "ok": 1.0}
    reply |= {"$clusterTime": RawBSONDocument(bson.encode(signed)), "operationTime": op_time}
    plain = {
        "id": Int64(cursor_id),
        "ns": ns,
        "nextBatch": [bson.decode(e) for e in events],
        "postBatchResumeToken": token,
    }
    assert _encoded(lambda c: c.raw, cursor) == _encoded(bson.encode, plain)
    expected = {**reply, "cursor": plain, "$clusterTime": signed}
    assert _encoded(lambda r: b"".join(document_parts(r)), reply) == _encoded(bson.encode, expected)


def test_a_cursor_id_out_of_range_fails_as_bson_encode_does():
    with pytest.raises(OverflowError):
        cursor_document(1 << 63, "db.c", "nextBatch", [], None)
