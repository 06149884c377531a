"""Which bucket an event goes to. This is a public contract; clients may compute it themselves.

Two modes, chosen per stream with `bucketBy`:

  "namespace" (the default)
      bucket_of(ns, n) = zlib.crc32(ns.encode("utf-8")) % n     with ns = "<db>.<collection>"
  "documentKey"
      bucket_of_document(ns, id, n)
          = zlib.crc32(bson.encode({"_id": id}), zlib.crc32(ns.encode("utf-8"))) % n
      i.e. the CRC-32 of the namespace's UTF-8 bytes followed by the BSON document {_id: <the
      documentKey's _id>} (that document's canonical bytes as pymongo's bson encodes them).

CRC-32 (the zlib/PNG/Ethernet polynomial) is pinned so that the proxy, every Spark executor and
any client in any language agree; Python's builtin hash() is salted per process and never used.

namespace: events that belong to one collection go to that collection's bucket, so each namespace
keeps its order inside one bucket. Events that span namespaces go, with the same token, to every
bucket they affect: a rename to the buckets of its source and its target; dropDatabase (which has
no collection) to every bucket, since any bucket may hold a collection of that database.

documentKey: one collection spreads over every bucket, while all events of one document stay in
one bucket, in order (what Kafka-based CDC gives per key). Only the documentKey's `_id` is hashed:
on a sharded collection the documentKey also holds the shard key, which an update may change (the
server, answering the update with WouldChangeOwningShard (283) internally, then writes a delete
and an insert in a transaction, each with its own documentKey); hashing the `_id` keeps those two
in one bucket, in order. An upsert is an insert (or an update) of its document and goes where
that document goes.
Events without a documentKey (DDL: create, drop, rename, dropDatabase, createIndexes, modify,
shardCollection, invalidate ...) go, with the same token, to every bucket: a barrier, so that a
bucket's consumer sees a collection's DDL in order with that collection's documents.
Transactions are split by document: each event of a transaction goes to its document's bucket;
every such event carries the transaction's `lsid` and `txnNumber` (as on mongos), which mark it.
Keeping a transaction together in one bucket would take a document's transactional writes out of
the bucket holding its other writes, breaking the per-document order that consumers rely on.
"""

from __future__ import annotations

import zlib
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument

from buckets.event_run import namespaces_of, raw_of
from mongoformats.change_events import EventFields
from mongoformats.oplog_splice import document_of, elements

__all__ = [
    "bucket_of",
    "bucket_of_document",
    "buckets_for_event",
    "buckets_for_namespaces",
    "BUCKET_BY",
    "MAX_BUCKETS",
]

MAX_BUCKETS = 1024
BUCKET_BY = ("namespace", "documentKey")


def bucket_of(ns: str, n: int) -> int:
    return zlib.crc32(ns.encode("utf-8")) % n


def bucket_of_document(ns: str, document_id: Any, n: int) -> int:
    """The documentKey-mode bucket of the document whose documentKey has `_id` `document_id`."""
    return zlib.crc32(bson.encode({"_id": document_id}), zlib.crc32(ns.encode("utf-8"))) % n


# The BSON types of `_id`s whose element bytes are what bson.encode writes for their decoded value
# (ObjectId, string, int32, int64, document, binary but the old subtype 2): the others (a symbol
# decodes to a str, a DBPointer to a DBRef ...) are re-encoded as the contract says.
# buckets/_columnar/document_routes.py computes the same buckets for a block's events where they
# lie (its tests pin it to `buckets_for_event`): a change here is a change there.
_COPIED_TYPES = frozenset((0x07, 0x02, 0x10, 0x12, 0x03, 0x05))


def _id_bytes(raw: bytes) -> bytes | None:
    """BSON {_id: <documentKey._id>} of a raw change event, or None if it has no documentKey.

    The usual `_id`'s element is found in the event's bytes and copied: inflating the event for
    it (RawBSONDocument) cost more than the rest of dealing it."""
    fields = elements(raw)
    found = fields.get(b"documentKey")
    if found is None or found[0] != 0x03:
        return None
    ident = elements(raw, found[1]).get(b"_id")
    if ident is None:
        return None
    t, v, e = ident
    if t in _COPIED_TYPES and (t != 0x05 or raw[v + 4] != 2):
        return document_of(b"%c_id\x00%s" % (t, raw[v:e]))
    return _decoded_id_bytes(raw)


def _decoded_id_bytes(raw: bytes) -> bytes | None:
    """`_id_bytes` through pymongo's decoder and encoder (what the contract names)."""
    key = RawBSONDocument(raw).get("documentKey")
    if not isinstance(key, RawBSONDocument) or "_id" not in key:
        return None
    return bson.encode({"_id": key["_id"]})


def buckets_for_event(event: EventFields, n: int, by: str = "namespace") -> tuple[int, ...]:
    namespaces = namespaces_of(event)
    if by == "documentKey":
        if len(namespaces) == 1:
            doc = _id_bytes(bytes(raw_of(event)))
            if doc is not None:
                return (zlib.crc32(doc, zlib.crc32(namespaces[0].encode("utf-8"))) % n,)
        return tuple(range(n))  # no documentKey: a barrier in every bucket
    return buckets_for_namespaces(namespaces, n)


def buckets_for_namespaces(namespaces: tuple[str, ...], n: int) -> tuple[int, ...]:
    """The buckets (of `n`) of events of `namespaces` dealt by namespace."""
    if len(namespaces) == 1:  # the common case: one collection
        return (zlib.crc32(namespaces[0].encode("utf-8")) % n,)
    if not namespaces:  # database-level events
        return tuple(range(n))
    return tuple(sorted({bucket_of(ns, n) for ns in namespaces}))
