"""One change event: its encoded document plus the fields ordering, filtering and bucketing need,
and the events derived from another (the invalidate after a drop, fullDocument set).

Sources (facts only): mongodb/mongo docs/change_stream_events.md, as summarized in
shared/reference/mongodb-formats.md C.11 (field order; tokens A.5).
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import Any, NamedTuple

import bson
from bson import Timestamp
from bson.datetime_ms import DatetimeMS

from mongoformats.oplog_splice import TOKEN_TIMESTAMP
from mongoformats.resume_token import (
    ResumeTokenData,
    decode_token,
    encode_token,
    token_from_key,
    token_sort_key,
)

# An entry's wallTime as the RAW codec decodes it (absent in entries of old servers).
Wall = datetime.datetime | DatetimeMS | None


class ChangeEvent(NamedTuple):
    """One change event: the encoded document plus what ordering, filtering and bucketing need.

    A NamedTuple rather than a frozen dataclass: the hot path makes one per event, and a tuple is
    built much faster than a frozen dataclass (which assigns through object.__setattr__).
    The token and the cluster time are derived from `sort_key` when asked for, not stored: the
    hot path only ever needs them for the last event of a batch.
    """

    sort_key: bytes  # resume token `_data` bytes: the total order of events
    type_bits: bytes  # the token's `_typeBits` (b"" when its KeyString needs none)
    op_type: str
    db: str
    coll: str | None  # None for database-level events (dropDatabase)
    raw: bytes  # the BSON event document, byte-identical to the server's
    # Every namespace ("db.coll") the event belongs to: a rename belongs to source and target.
    namespaces: tuple[str, ...] = ()
    shard: str = ""  # the shard whose oplog it came from (set only when lookups need it)
    # An op of a transaction: (ts of the applyOps entry that holds it, its index there), where
    # the server records its pre- and post-images (the unwinder's applyOpsTs and applyOpsIndex).
    # It differs from (clusterTime, txnOpIndex) in a chained or prepared transaction. None: at
    # (clusterTime, 0), as for every write outside a transaction.
    applied_at: tuple[Timestamp, int] | None = None

    @classmethod
    def for_token(
        cls,
        token: Mapping[str, Any],
        op_type: str,
        db: str,
        coll: str | None,
        raw: bytes,
        namespaces: tuple[str, ...] = (),
    ) -> ChangeEvent:
        return cls(
            token_sort_key(token),
            bytes(token.get("_typeBits", b"")),
            op_type,
            db,
            coll,
            raw,
            namespaces,
        )

    @property
    def token(self) -> dict[str, Any]:
        """The event's `_id`: {_data: hex of the KeyString, _typeBits?}."""
        return event_token(self)

    @property
    def cluster_time(self) -> Timestamp:
        """Every token's KeyString starts with its cluster time: type byte 0x82, then seconds and
        increment, big-endian."""
        secs, inc = TOKEN_TIMESTAMP.unpack_from(self.sort_key, 1)
        return Timestamp(secs, inc)


# Events from their fields as plain tuples (splice_crud's items, or events sent as tuples by a
# reader process). tuple.__new__ skips NamedTuple._make's Python-level wrapper and length check
# (a third of the cost); the tuples are ours, always all nine fields.
event_from_fields = functools.partial(tuple.__new__, ChangeEvent)
# Where many events wait a while (the engine's merge and buckets), each is the plain tuple of a
# ChangeEvent's fields, read by position (a ChangeEvent reads the same way). Why: the collector
# stops tracking a plain tuple of bytes and str after one collection, never a tuple subclass, and
# each full collection would walk every buffered event, a pause that grows with the buffers.
EventFields = tuple[Any, ...]
(
    EV_SORT_KEY,
    EV_TYPE_BITS,
    EV_OP_TYPE,
    EV_DB,
    EV_COLL,
    EV_RAW,
    EV_NAMESPACES,
    EV_SHARD,
    EV_APPLIED_AT,
) = range(9)
# An event's sort key and bytes by position: for key= and map() over many events, where an
# itemgetter is cheaper than attribute access or indexing in a lambda.
EVENT_SORT_KEY = itemgetter(EV_SORT_KEY)
EVENT_BYTES = itemgetter(EV_RAW)


def event_token(event: EventFields) -> dict[str, Any]:
    """An event's `_id` (resume token), from its fields."""
    return token_from_key(event[EV_SORT_KEY], event[EV_TYPE_BITS])


def events_from_fields(items: Iterable[EventFields]) -> list[ChangeEvent]:
    return list(map(event_from_fields, items))


def invalidate_event(trigger: ChangeEvent, *, wall: Wall = None) -> ChangeEvent:
    """The `invalidate` that follows an event closing a single-collection or database stream.

    Its token is the triggering event's token with fromInvalidate set (mongodb-formats.md C.11).
    """
    data = decode_token(trigger.token)
    token = encode_token(
        ResumeTokenData(
            data.cluster_time,
            data.version,
            data.token_type,
            data.txn_op_index,
            True,
            data.uuid,
            data.event_identifier,
            data.fragment_num,
        )
    )
    doc: dict[str, Any] = {
        "_id": token,
        "operationType": "invalidate",
        "clusterTime": data.cluster_time,
    }
    if wall is not None:
        doc["wallTime"] = wall
    return ChangeEvent.for_token(
        token, "invalidate", trigger.db, trigger.coll, bson.encode(doc), trigger.namespaces
    )
