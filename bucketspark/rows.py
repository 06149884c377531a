"""The row a change event becomes in Spark, and its schema."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import bson
from bson import ObjectId, json_util
from bson.raw_bson import RawBSONDocument

from mongoformats.codecs import PLAIN

SCHEMA = (
    "bucket INT, token STRING, clusterTime TIMESTAMP, clusterTimeInc BIGINT, operationType STRING, "
    "db STRING, coll STRING, documentKey STRING, event BINARY, eventJson STRING"
)


# Events up to this size are decoded whole, in one call of bson's C decoder, to build their row:
# several times cheaper than reading a RawBSONDocument field by field, since each of its nested
# documents is an object made in Python. A larger event is read raw, so that its document is
# not decoded only to be dropped.
DECODE_WHOLE_BYTES = 64 << 10


def key_json(key: Mapping[str, Any]) -> str:
    """A documentKey as canonical Extended JSON, as json_util.dumps writes it. The common key,
    an ObjectId `_id` alone, is written directly: json_util walks the value in Python."""
    if len(key) == 1 and type(oid := key.get("_id")) is ObjectId:
        return '{"_id": {"$oid": "' + str(oid) + '"}}'
    if isinstance(key, RawBSONDocument):
        key = bson.decode(key.raw, PLAIN)
    return json_util.dumps(key, json_options=json_util.CANONICAL_JSON_OPTIONS)


def event_row(
    bucket: int, ev: RawBSONDocument, *, with_json: bool, payload: RawBSONDocument | None = None
) -> tuple[Any, ...]:
    """The row of `ev`; its event and eventJson columns hold `payload` instead when given (the
    event's fullDocument, for change.stream.publish.full.document.only)."""
    raw = ev.raw
    fields: Mapping[str, Any] = bson.decode(raw, PLAIN) if len(raw) <= DECODE_WHOLE_BYTES else ev
    ct = fields["clusterTime"]
    ns = fields.get("ns") or {}
    key = fields.get("documentKey")
    body = raw if payload is None else payload.raw
    as_json = None
    if with_json:
        decoded = (
            fields if payload is None and isinstance(fields, dict) else bson.decode(body, PLAIN)
        )
        as_json = json_util.dumps(decoded, json_options=json_util.RELAXED_JSON_OPTIONS)
    return (
        bucket,
        fields["_id"]["_data"],
        datetime.datetime.fromtimestamp(ct.time, datetime.UTC),
        ct.inc,
        fields["operationType"],
        ns.get("db"),
        ns.get("coll"),
        key_json(key) if key else None,
        bytes(body),
        as_json,
    )


ARROW_ROWS = 2000  # rows per Arrow record batch a read yields


def arrow_schema() -> Any:
    """SCHEMA as Arrow types (pyarrow is imported only where Spark runs)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("bucket", pa.int32()),
            ("token", pa.string()),
            ("clusterTime", pa.timestamp("us", tz="UTC")),
            ("clusterTimeInc", pa.int64()),
            ("operationType", pa.string()),
            ("db", pa.string()),
            ("coll", pa.string()),
            ("documentKey", pa.string()),
            ("event", pa.binary()),
            ("eventJson", pa.string()),
        ]
    )


def arrow_batches(rows: Any, schema: Any) -> Any:
    """Group row tuples into Arrow record batches: Spark then takes whole column buffers instead of
    converting one Python tuple at a time."""
    import pyarrow as pa

    def batch(chunk: list[tuple[Any, ...]]) -> Any:
        columns = zip(*chunk, strict=True)
        return pa.RecordBatch.from_arrays(
            [pa.array(col, f.type) for col, f in zip(columns, schema, strict=True)], schema=schema
        )

    chunk: list[tuple[Any, ...]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= ARROW_ROWS:
            yield batch(chunk)
            chunk = []
    if chunk:
        yield batch(chunk)
