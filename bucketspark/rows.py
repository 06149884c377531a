"""The row a change event becomes in Spark, and its schema."""

from __future__ import annotations

import datetime
from typing import Any

import bson
from bson import json_util
from bson.raw_bson import RawBSONDocument

from mongoformats.codecs import PLAIN

SCHEMA = (
    "bucket INT, token STRING, clusterTime TIMESTAMP, clusterTimeInc BIGINT, operationType STRING, "
    "db STRING, coll STRING, documentKey STRING, event BINARY, eventJson STRING"
)


# {_id: ObjectId} as BSON: int32 length 22, type 0x07, "_id" and its 0, 12 bytes, the closing 0.
_OID_KEY_HEAD = b"\x16\x00\x00\x00\x07_id\x00"


def key_json(key: RawBSONDocument) -> str:
    """A documentKey as canonical Extended JSON, as json_util.dumps writes it. The common key,
    an ObjectId `_id` alone, is written straight from its bytes: decoding it and running
    json_util would be a third of a row's cost."""
    raw = key.raw
    if len(raw) == 22 and raw.startswith(_OID_KEY_HEAD):
        return '{"_id": {"$oid": "' + raw[9:21].hex() + '"}}'
    return json_util.dumps(bson.decode(raw, PLAIN), json_options=json_util.CANONICAL_JSON_OPTIONS)


def event_row(bucket: int, ev: RawBSONDocument, *, with_json: bool,
              payload: RawBSONDocument | None = None) -> tuple[Any, ...]:
    """The row of `ev`; its event and eventJson columns hold `payload` instead when given (the
    event's fullDocument, for change.stream.publish.full.document.only)."""
    ct = ev["clusterTime"]
    ns = ev.get("ns") or {}
    key = ev.get("documentKey")
    doc_key = key_json(key) if key else None
    body = ev if payload is None else payload
    as_json = json_util.dumps(bson.decode(body.raw, PLAIN),
                              json_options=json_util.RELAXED_JSON_OPTIONS) if with_json else None
    return (bucket, ev["_id"]["_data"], datetime.datetime.fromtimestamp(ct.time, datetime.UTC), ct.inc,
            ev["operationType"], ns.get("db"), ns.get("coll"), doc_key, bytes(body.raw), as_json)


ARROW_ROWS = 2000  # rows per Arrow record batch a read yields


def arrow_schema() -> Any:
    """SCHEMA as Arrow types (pyarrow is imported only where Spark runs)."""
    import pyarrow as pa

    return pa.schema([("bucket", pa.int32()), ("token", pa.string()), ("clusterTime", pa.timestamp("us", tz="UTC")),
                      ("clusterTimeInc", pa.int64()), ("operationType", pa.string()), ("db", pa.string()),
                      ("coll", pa.string()), ("documentKey", pa.string()), ("event", pa.binary()),
                      ("eventJson", pa.string())])


def arrow_batches(rows: Any, schema: Any) -> Any:
    """Group row tuples into Arrow record batches: Spark then takes whole column buffers instead of
    converting one Python tuple at a time."""
    import pyarrow as pa

    def batch(chunk: list[tuple[Any, ...]]) -> Any:
        columns = zip(*chunk, strict=True)
        return pa.RecordBatch.from_arrays([pa.array(col, f.type) for col, f in zip(columns, schema, strict=True)],
                                          schema=schema)

    chunk: list[tuple[Any, ...]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= ARROW_ROWS:
            yield batch(chunk)
            chunk = []
    if chunk:
        yield batch(chunk)
