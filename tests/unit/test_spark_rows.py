"""The row a change event becomes in Spark, built without Spark."""

from __future__ import annotations

import datetime
import uuid

import bson
import pytest
from bson import Binary, Decimal128, Int64, ObjectId, Timestamp, json_util
from bson.raw_bson import RawBSONDocument

from bucketspark.client import _token_key_of, token_key
from bucketspark.rows import DECODE_WHOLE_BYTES, event_row, key_json
from mongoformats.codecs import PLAIN, RAW


@pytest.mark.parametrize(
    "key",
    [
        {"_id": ObjectId()},
        {"_id": ObjectId("000000000000000000000000")},
        {"_id": ObjectId(), "sk": 1},  # a sharded collection's key holds the shard key too
        {"sk": 1, "_id": ObjectId()},
        {"id": ObjectId()},  # as long as an ObjectId _id, but another name
        {"_id": 7},
        {"_id": Int64(7)},
        {"_id": 'o\u00e9"\\'},
        {"_id": Decimal128("1.5")},
        {"_id": Binary(uuid.UUID(int=3).bytes, 4)},
        {"_id": {"a": ObjectId(), "b": [1, 2]}},
    ],
)
def test_a_document_key_is_written_as_json_util_writes_it(key):
    """Canonical Extended JSON, character for character, whichever way it is built."""
    raw = bson.encode(key)
    expected = json_util.dumps(bson.decode(raw), json_options=json_util.CANONICAL_JSON_OPTIONS)
    assert key_json(bson.decode(raw, PLAIN)) == key_json(RawBSONDocument(raw, RAW)) == expected


def _event(op: str, doc_bytes: int = 10, **extra: object) -> RawBSONDocument:
    event = {
        "_id": {"_data": "8263A1B2C3000000012B"},
        "operationType": op,
        "clusterTime": Timestamp(1_700_000_000, 7),
        "wallTime": datetime.datetime(2026, 1, 1),
        "ns": {"db": "shop", "coll": "orders"},
        **extra,
    }
    if op == "insert":
        doc = {"_id": ObjectId(), "pad": "x" * doc_bytes, "at": datetime.datetime(9999, 1, 1)}
        event |= {"fullDocument": doc, "documentKey": {"_id": doc["_id"]}}
    return RawBSONDocument(bson.encode(event), RAW)


@pytest.mark.parametrize(
    "event",
    [
        _event("insert"),
        _event("insert", DECODE_WHOLE_BYTES),
        _event("drop"),
        _event("insert", collectionUUID=uuid.uuid4().bytes),
    ],
    ids=["small", "larger than decoded whole", "ddl", "more fields"],
)
@pytest.mark.parametrize("with_json", [False, True])
def test_a_row_holds_the_events_fields_its_bytes_and_its_json(event, with_json):
    row = event_row(3, event, with_json=with_json)
    decoded = bson.decode(event.raw, PLAIN)
    key = decoded.get("documentKey")
    assert row == (
        3,
        "8263A1B2C3000000012B",
        datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC),
        7,
        decoded["operationType"],
        "shop",
        "orders",
        json_util.dumps(key, json_options=json_util.CANONICAL_JSON_OPTIONS) if key else None,
        event.raw,
        json_util.dumps(decoded, json_options=json_util.RELAXED_JSON_OPTIONS)
        if with_json
        else None,
    )


@pytest.mark.parametrize("with_json", [False, True])
def test_a_full_document_only_row_holds_the_documents_bytes_and_json(with_json):
    event = _event("insert")
    doc = event["fullDocument"]
    row = event_row(0, event, with_json=with_json, payload=doc)
    assert row[7] == key_json(bson.decode(event.raw)["documentKey"]) and row[8] == doc.raw
    assert row[9] == (
        json_util.dumps(bson.decode(doc.raw, PLAIN), json_options=json_util.RELAXED_JSON_OPTIONS)
        if with_json
        else None
    )


@pytest.mark.parametrize(
    "event",
    [
        {"_id": {"_data": "8263A1B2C3000000012B"}, "operationType": "insert"},
        {"_id": {"_typeBits": b"", "_data": "8263A1B2C3000000012C"}},  # _data not first in _id
        {"operationType": "drop", "_id": {"_data": "8263A1B2C3000000012D"}},  # _id not first
        {"_id": {"_data": ""}},
    ],
)
def test_an_events_token_is_read_from_its_bytes_as_from_its_fields(event):
    raw = RawBSONDocument(bson.encode({"e": event}), RAW)["e"]  # nested: bson keeps the field order
    assert _token_key_of(raw) == token_key(event["_id"]["_data"])
    in_a_reply = RawBSONDocument(memoryview(raw.raw), RAW)  # as pymongo may hand events out
    assert _token_key_of(in_a_reply) == token_key(event["_id"]["_data"])
