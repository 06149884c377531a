"""The row a change event becomes in Spark, and its schema."""

from __future__ import annotations

import datetime
from typing import Any

import bson
from bson import json_util
from bson.raw_bson import RawBSONDocument

SCHEMA = (
    "bucket INT, token STRING, clusterTime TIMESTAMP, clusterTimeInc BIGINT, operationType STRING, "
    "db STRING, coll STRING, documentKey STRING, event BINARY, eventJson STRING"
)


def event_row(bucket: int, ev: RawBSONDocument, *, with_json: bool) -> tuple[Any, ...]:
    ct = ev["clusterTime"]
    ns = ev.get("ns") or {}
    key = ev.get("documentKey")
    doc_key = json_util.dumps(bson.decode(key.raw), json_options=json_util.CANONICAL_JSON_OPTIONS) if key else None
    as_json = json_util.dumps(bson.decode(ev.raw), json_options=json_util.RELAXED_JSON_OPTIONS) if with_json else None
    return (bucket, ev["_id"]["_data"], datetime.datetime.fromtimestamp(ct.time, datetime.UTC), ct.inc,
            ev["operationType"], ns.get("db"), ns.get("coll"), doc_key, bytes(ev.raw), as_json)
