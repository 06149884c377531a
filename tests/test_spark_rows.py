"""The row a change event becomes in Spark, built without Spark."""

from __future__ import annotations

import uuid

import bson
import pytest
from bson import Binary, Decimal128, Int64, ObjectId, json_util
from bson.raw_bson import RawBSONDocument

from bucketspark.rows import key_json


@pytest.mark.parametrize("key", [
    {"_id": ObjectId()},
    {"_id": ObjectId("000000000000000000000000")},
    {"_id": ObjectId(), "sk": 1},  # a sharded collection's key holds the shard key too
    {"sk": 1, "_id": ObjectId()},
    {"id": ObjectId()},  # as long as an ObjectId _id, but another name
    {"_id": 7}, {"_id": Int64(7)}, {"_id": "o\u00e9\"\\"}, {"_id": Decimal128("1.5")},
    {"_id": Binary(uuid.UUID(int=3).bytes, 4)}, {"_id": {"a": ObjectId(), "b": [1, 2]}},
])
def test_a_document_key_is_written_as_json_util_writes_it(key):
    """Canonical Extended JSON, character for character, whichever way it is built."""
    raw = bson.encode(key)
    expected = json_util.dumps(bson.decode(raw), json_options=json_util.CANONICAL_JSON_OPTIONS)
    assert key_json(RawBSONDocument(raw)) == expected
