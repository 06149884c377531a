"""Writing one change event: its fields in the server's order, its resume token, and the
transaction fields that go before `_id`. Shared by the CRUD and the DDL events.

Sources (facts only): mongodb/mongo src/mongo/db/pipeline/change_stream_event_transform.cpp, as
summarized in shared/reference/mongodb-formats.md C.11 (field order) and A.5 (tokens).
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import bson
from bson import Binary, Timestamp
from bson.raw_bson import RawBSONDocument

from mongoformats.codecs import PLAIN
from mongoformats.events import ChangeEvent, Wall
from mongoformats.oplog_splice import document_of
from mongoformats.resume_token import EVENT_TOKEN, ResumeTokenData, encode_token

INTERNAL_DBS = frozenset({"admin", "config", "local"})
# Events of these types keep their documentKey itself as the token's identifier in v0/v1 tokens.
_CLASSIC = frozenset(
    {"insert", "update", "replace", "delete", "drop", "rename", "dropDatabase", "invalidate"}
)

# A collection's UUID as an entry holds it (binData subtype 4), or as a caller gives it.
CollectionUUID = Binary | uuidlib.UUID
# A transaction's identity in its events: (lsid, txnNumber).
Txn = tuple[Mapping[str, Any], int]


class EventAt(NamedTuple):
    """Where an event stands: its entry's time and wall time, its index among a transaction's
    operations (0 outside one), and the transaction it belongs to."""

    ts: Timestamp
    wall: Wall
    txn_op_index: int = 0
    txn: Txn | None = None


class DdlEvent(NamedTuple):
    """A DDL event's parts before it is written (see `EventWriter.ddl`)."""

    op_type: str
    db: str
    coll: str | None  # None for database-level events (dropDatabase)
    ui: CollectionUUID | None
    desc: dict[str, Any] | None  # its operationDescription
    show_desc: bool = True
    to: dict[str, Any] | None = None  # a rename's target namespace
    state_before: dict[str, Any] | None = None
    extra_ns: tuple[str, ...] = ()  # namespaces it also belongs to (a rename's target)
    show_uuid: bool = True


def is_internal_namespace(ns: str) -> bool:
    """admin/config/local and system collections never produce user events."""
    db, _, coll = ns.partition(".")
    return db in INTERNAL_DBS or coll.startswith("system.")


def plain(doc: Any) -> Any:
    """Decode a raw sub-document into Python values (types kept: Int64 stays Int64)."""
    if isinstance(doc, RawBSONDocument):
        return bson.decode(doc.raw, PLAIN)
    return doc


def split_ns(ns: str) -> tuple[str, str]:
    db, _, coll = ns.partition(".")
    return db, coll


def later(a: Timestamp, b: Timestamp) -> bool:
    return (a.time, a.inc) > (b.time, b.inc)


def _uuid(value: CollectionUUID | None) -> uuidlib.UUID | None:
    if value is None:
        return None
    if isinstance(value, uuidlib.UUID):
        return value
    return uuidlib.UUID(bytes=bytes(value))


def identifier(
    op_type: str,
    document_key: Mapping[str, Any] | None,
    desc: Mapping[str, Any] | None,
    version: int,
) -> Mapping[str, Any] | None:
    """The token's eventIdentifier."""
    if version >= 2 or op_type not in _CLASSIC:
        ident: dict[str, Any] = {"operationType": op_type}
        if document_key is not None:
            ident["documentKey"] = document_key
        elif desc is not None:
            ident["operationDescription"] = desc
        return ident
    return document_key  # v0/v1 classic events: the documentKey itself (absent for DDL)


def _ns_of(db: str, coll: str | None) -> dict[str, str]:
    """An event's `ns`: its database, and its collection if it has one."""
    return {"db": db, "coll": coll} if coll is not None else {"db": db}


def _uuid_field(ui: CollectionUUID | None) -> dict[str, Any]:
    return {"collectionUUID": ui} if ui is not None else {}


def _expanded_ddl_fields(event: DdlEvent) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if event.desc is not None and event.show_desc:
        fields["operationDescription"] = event.desc
    if event.state_before is not None:
        fields["stateBeforeChange"] = event.state_before
    return fields


class EventWriter:
    """A stream's options, and the events written with them.

    Args: see `mongoformats.change_events.OplogTransformer`, which passes its own on.
    """

    def __init__(
        self,
        *,
        show_expanded_events: bool = False,
        show_migration_events: bool = False,
        show_system_events: bool = False,
        token_version: int = 2,
        ddl_notes: bool = False,
        view_events: bool = True,
        keep_version: tuple[Timestamp, int] | None = None,
    ) -> None:
        self.show_expanded_events = show_expanded_events
        self.show_migration_events = show_migration_events
        self.show_system_events = show_system_events
        self.token_version = token_version
        self.ddl_notes = ddl_notes
        self.view_events = view_events
        self.keep_version = (
            keep_version if keep_version is not None and keep_version[1] != token_version else None
        )

    def reached(self, ts: Timestamp) -> None:
        """Entries come in oplog order: past the resume time, every token has the stream's
        version."""
        if self.keep_version is not None and later(ts, self.keep_version[0]):
            self.keep_version = None

    def version_at(self, ts: Timestamp) -> int:
        """The version of the tokens of events at `ts` (see `keep_version`)."""
        keep = self.keep_version
        return keep[1] if keep is not None and not later(ts, keep[0]) else self.token_version

    def ddl(self, event: DdlEvent, at: EventAt) -> ChangeEvent:
        """A DDL event, written with its token."""
        coll = event.coll
        ident = identifier(event.op_type, None, event.desc, self.version_at(at.ts))
        namespaces = ((f"{event.db}.{coll}",) if coll is not None else ()) + event.extra_ns
        fields = self._ddl_fields(event, at)
        return self.finish(at, event.ui, ident, fields, event.op_type, event.db, coll, namespaces)

    def _ddl_fields(self, event: DdlEvent, at: EventAt) -> dict[str, Any]:
        """`to` first, then the fields of every event, then the expanded ones."""
        expanded = self.show_expanded_events
        # The server adds `to` ahead of `_id` (mongodb-formats.md C.11); `finish` moves it there.
        fields: dict[str, Any] = {"to": event.to} if event.to is not None else {}
        fields["operationType"] = event.op_type
        fields["clusterTime"] = at.ts
        if expanded and event.show_uuid:
            fields.update(_uuid_field(event.ui))
        if at.wall is not None:
            fields["wallTime"] = at.wall
        fields["ns"] = _ns_of(event.db, event.coll)
        if expanded:
            fields.update(_expanded_ddl_fields(event))
        return fields

    def finish(
        self,
        at: EventAt,
        ui: CollectionUUID | None,
        ident: Mapping[str, Any] | None,
        fields: dict[str, Any],
        op_type: str,
        db: str,
        coll: str | None,
        namespaces: tuple[str, ...],
    ) -> ChangeEvent:
        """The event of `fields` (in order, without `_id`), with its token."""
        ts = at.ts
        token = encode_token(
            ResumeTokenData(
                ts, self.version_at(ts), EVENT_TOKEN, at.txn_op_index, False, _uuid(ui), ident
            )
        )
        head: dict[str, Any] = {}
        if "to" in fields:
            head["to"] = fields.pop("to")
        if at.txn is not None:
            head["txnNumber"] = at.txn[1]
            head["lsid"] = at.txn[0]
        raw = bson.encode({"_id": token, **fields})
        if head:
            # These precede _id in the server's events (C.11), but bson.encode always writes a
            # top-level _id first, so the two parts are encoded apart and joined.
            raw = document_of(bson.encode(head)[4:-1] + raw[4:-1])
        return ChangeEvent.for_token(token, op_type, db, coll, raw, namespaces)
