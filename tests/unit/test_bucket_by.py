"""bucketBy: "documentKey", the bucket function (buckets/bucketing.py has the contract): pinned
values any client can compute, and the _id read from an event's bytes
(tests/integration/test_bucket_by.py deals a collection over every bucket through a proxy)."""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument
from hypothesis import given, settings
from hypothesis import strategies as st

from buckets.bucketing import bucket_of_document, buckets_for_event


def _fields(event: dict[str, Any], namespaces: tuple[str, ...]) -> tuple[Any, ...]:
    """EventFields as the splice makes them (mongoformats.change_events: sort key, type bits,
    operationType, db, coll, raw, namespaces, shard, applied at)."""
    return (b"", b"", event["operationType"], "d", "c", bson.encode(event), namespaces, "", None)


def test_bucket_of_document_is_pinned_crc32():
    """Values any client can compute: crc32 of the namespace then of BSON {_id: <id>}."""
    assert [
        bucket_of_document("shop.orders", i, 8)
        for i in (1, 2, 3, "a", bson.ObjectId("65a000000000000000000001"))
    ] == [2, 2, 2, 5, 3]
    assert bucket_of_document("shop.orders", 2, 1024) == 418
    assert (
        bucket_of_document("shop.orders", 1, 8)
        == zlib.crc32(b"shop.orders" + bson.encode({"_id": 1})) % 8
    )
    assert bucket_of_document("a.b", 1, 1) == 0
    # 1000 integer ids spread evenly: no bucket over 26% of 4
    assert max(Counter(bucket_of_document("h.hot", i, 4) for i in range(1000)).values()) < 260


def test_buckets_for_event_by_document():
    """Only the documentKey's _id counts (a shard key change keeps the document's bucket); events
    without a documentKey, even of one collection, go to every bucket."""
    insert = _fields({"operationType": "insert", "documentKey": {"_id": 7}}, ("d.c",))
    moved = _fields({"operationType": "delete", "documentKey": {"k": 1, "_id": 7}}, ("d.c",))
    assert buckets_for_event(insert, 16, "documentKey") == (bucket_of_document("d.c", 7, 16),)
    assert buckets_for_event(moved, 16, "documentKey") == buckets_for_event(
        insert, 16, "documentKey"
    )
    create = _fields({"operationType": "createIndexes"}, ("d.c",))
    drop_db = _fields({"operationType": "dropDatabase"}, ())
    rename = _fields({"operationType": "rename"}, ("d.a", "d.b"))
    for ddl in (create, drop_db, rename):
        assert buckets_for_event(ddl, 4, "documentKey") == (0, 1, 2, 3)
    # the default stays by namespace
    assert (
        buckets_for_event(insert, 16) == buckets_for_event(create, 16) == (zlib.crc32(b"d.c") % 16,)
    )


_ids = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**62), 2**62).map(bson.Int64),
    st.text(max_size=8),
    st.builds(bson.ObjectId),
    st.binary(max_size=8),
    st.uuids().map(lambda u: bson.Binary(u.bytes, 4)),
    st.binary(max_size=4).map(lambda b: bson.Binary(b, 2)),
    st.floats(allow_nan=False),
    st.fixed_dictionaries({"a": st.integers(0, 9), "b": st.text(max_size=3)}),
    # A regex pattern is a BSON cstring: UTF-8 (no lone surrogate) without a NUL byte (bson
    # refuses to encode either).
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4).map(bson.Regex),
    st.just(bson.MinKey()),
    st.integers(0, 2**40).map(bson.datetime_ms.DatetimeMS),
)


@settings(max_examples=200, deadline=None)
@given(_ids, st.booleans())
def test_the_id_is_read_from_the_events_bytes_as_the_contract_encodes_it(
    ident: Any, shard_key: bool
) -> None:
    """The documentKey's `_id` element, copied from the event's bytes, hashes as bson.encode of
    its decoded value does, whatever its type (some types are re-encoded)."""
    key = {"sk": 1, "_id": ident} if shard_key else {"_id": ident}
    event = _fields(
        {
            "_id": {"_data": "82"},
            "operationType": "delete",
            "ns": {"db": "d", "coll": "c"},
            "documentKey": key,
        },
        ("d.c",),
    )
    want = (
        zlib.crc32(
            bson.encode({"_id": RawBSONDocument(event[5])["documentKey"]["_id"]}),
            zlib.crc32(b"d.c"),
        )
        % 64
    )
    assert buckets_for_event(event, 64, "documentKey") == (want,)
