"""Which events a stream keeps, applied as the merge deals them: an accelerated watch()'s scope
(its collection or database, and the event that invalidates it), and a stream's $match."""

from __future__ import annotations

from typing import Any

import bson

from buckets.event_run import db_of, namespaces_of, op_type_of, raw_of
from mongoformats.change_events import EventFields
from mongoformats.codecs import PLAIN
from mongoformats.mql import matches


def in_scope(ev: EventFields, scope: tuple[str, str | None]) -> bool:
    """buildOperationFilter (change_stream_filter_helpers.cpp): an event of a namespace the stream
    watches (a rename by its source or its target, `o.to`); dropDatabase on a database stream
    only ("Omit dropDatabase on single-collection streams")."""
    db, coll = scope
    if coll is None:
        namespaces = namespaces_of(ev)
        return db_of(ev) == db or any(ns.partition(".")[0] == db for ns in namespaces)
    return f"{db}.{coll}" in namespaces_of(ev)


def invalidates(ev: EventFields, scope: tuple[str, str | None]) -> bool:
    """isInvalidatingCommand: drop/rename end a collection stream; dropDatabase a database
    stream."""
    op_type = op_type_of(ev)
    if scope[1] is None:
        return bool(op_type == "dropDatabase")
    return bool(op_type in ("drop", "rename"))


def event_matches(ev: EventFields, match: dict[str, Any]) -> bool:
    """Whether `ev` passes the $match `match` (a MongoError if the $match fails on it)."""
    return matches(bson.decode(raw_of(ev), PLAIN), match)
