"""simcluster's own oplog-to-change-event transform: the reference the engine is tested against.

Plain, direct code: each oplog entry is decoded with `bson` and each event is built as a
document, field by field, in the server's order. It shares nothing with the engine's transform
(mongoformats.change_events and the splicing modules) but the resume-token byte codec, so a
transform bug shows up as a difference between the two instead of on both sides
(tests/unit/test_layering.py keeps it so).

Sources (facts only), mongodb/mongo src/mongo/db/pipeline/:
- change_stream_event_transform.cpp, ChangeStreamDefaultEventTransformation::applyTransformation:
  the event's fields and their order (shared/reference/mongodb-formats.md C.11): `txnNumber`,
  `lsid` (transactions) and `to` (rename) ahead of `_id`; then operationType, clusterTime,
  collectionUUID (showExpandedEvents), wallTime, fullDocument, ns, documentKey,
  operationDescription (showExpandedEvents), updateDescription, stateBeforeChange.
- the same file, ChangeStreamViewDefinitionEventTransformation: writes to `<db>.system.views` are
  view events (insert: create, update: modify, delete: drop) whose operationDescription is the
  view document without `_id`, with no collectionUUID, and whose token carries the `ui` of the
  system.views entry; only streams that are not single-collection streams use it (getBuilder).
- change_stream_filter_helpers.cpp: which entries a stream sees. Collections named `system.*`
  never (the collection regex), `fromMigrate` entries only with showMigrationEvents (a
  migration's create and createIndexes also with showSystemEvents),
  dropDatabase never on a single-collection stream ("the user will incorrectly see it if they
  startAfter the invalidate"), the expanded DDL and sharding noops only with showExpandedEvents.
- change_stream_unwind_transaction / the transaction history iterator: a transaction's ops are
  numbered by txnOpIndex across its whole chain and all get the commit entry's clusterTime; an
  applyOps without lsid, or with multiOpType 1, carries no transaction identity.
- ChangeStreamEventTransformation::makeResumeToken: eventIdentifier {operationType, documentKey}
  or {operationType, operationDescription} (v2, and every event not of the classic kinds), the
  documentKey alone for classic events of v0/v1 tokens; an event at the clusterTime of the
  token the stream resumed from keeps that token's version (7.0's rule).
- document_source_change_stream_check_invalidate.cpp: the invalidate event.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import bson
from bson import Timestamp

from mongoformats.codecs import PLAIN
from mongoformats.resume_token import (
    EVENT_TOKEN,
    ResumeTokenData,
    encode_token_generic,
    token_sort_key,
)
from simcluster.reference_fields import EXPANDED_DDL, crud_fields, ddl_description, view_fields

__all__ = ["RefEvent", "ReferenceTransformer", "encode_event", "invalidate_for"]

_INTERNAL_DBS = ("admin", "config", "local")
# Kinds whose v0/v1 token identifier is the documentKey (none for the DDL among them).
_CLASSIC = ("insert", "update", "replace", "delete", "drop", "rename", "dropDatabase", "invalidate")
# Sharding's noops: the o2 field naming the collection, and whether showSystemEvents is needed.
_NOOP_EVENTS = (
    ("shardCollection", False),
    ("reshardCollection", False),
    ("refineCollectionShardKey", False),
    ("migrateLastChunkFromShard", True),
)


@dataclass
class RefEvent:
    """One event: its document (in the server's field order) and what the stream needs."""

    doc: dict[str, Any]
    token: dict[str, Any]
    sort_key: bytes
    cluster_time: Timestamp
    op_type: str
    db: str
    coll: str | None
    # Where the write's pre- and post-images are recorded: (collection UUID bytes, the ts of
    # the entry holding the write, the write's index there); None for events without images.
    image_key: tuple[bytes, Timestamp, int] | None = None


def encode_event(doc: Mapping[str, Any]) -> bytes:
    """The event as BSON in its own field order (bson.encode would move a top-level `_id`
    first, ahead of a transaction's txnNumber and lsid): encoded as a sub-document, cut out."""
    wrapped = bson.encode({"": doc})
    return wrapped[6:-1]  # int32 length, type 0x03, empty name and its NUL; the trailing NUL


def invalidate_for(trigger: RefEvent) -> RefEvent:
    """The invalidate after `trigger`: its token is the trigger's with fromInvalidate set."""
    data = _token_data(trigger.token)
    token = encode_token_generic(
        ResumeTokenData(
            data.cluster_time,
            data.version,
            EVENT_TOKEN,
            data.txn_op_index,
            True,
            data.uuid,
            data.event_identifier,
        )
    )
    doc: dict[str, Any] = {
        "_id": token,
        "operationType": "invalidate",
        "clusterTime": trigger.cluster_time,
    }
    if "wallTime" in trigger.doc:
        doc["wallTime"] = trigger.doc["wallTime"]
    return RefEvent(
        doc,
        token,
        token_sort_key(token),
        trigger.cluster_time,
        "invalidate",
        trigger.db,
        trigger.coll,
    )


def _token_data(token: Mapping[str, Any]) -> ResumeTokenData:
    from mongoformats.resume_token import decode_token

    return decode_token(token)


def _split(ns: str) -> tuple[str, str]:
    db, _, coll = ns.partition(".")
    return db, coll


def _uuid(value: Any) -> uuidlib.UUID | None:
    return None if value is None else uuidlib.UUID(bytes=bytes(value))


class ReferenceTransformer:
    """One shard's oplog entries, in order, to the events one change stream shows.

    Args:
        db, coll: the stream's database and collection (None: a database stream); with
            cluster=True, every user database.
        expanded, migration, system_events: showExpandedEvents, showMigrationEvents,
            showSystemEvents.
        version: the stream's token version (2 for 7.0/8.0).
        resumed_from: the decoded token the stream resumed from, if any.
        chain: the entries of a transaction's chain through a given ts, oldest first (for a
            commit whose earlier entries were written before this transformer's first entry).
    """

    def __init__(
        self,
        *,
        db: str,
        coll: str | None,
        cluster: bool,
        expanded: bool,
        migration: bool,
        system_events: bool,
        version: int,
        resumed_from: ResumeTokenData | None,
        chain: Callable[[Timestamp], list[bytes]],
    ) -> None:
        self.db, self.coll, self.cluster = db, coll, cluster
        self.single = coll is not None and not cluster
        self.expanded, self.migration, self.system_events = expanded, migration, system_events
        self.version, self.resumed_from, self.chain = version, resumed_from, chain
        # A transaction's ops from its partialTxn/prepare entries, until its commit:
        # (lsid id, txnNumber) -> [(op, ts of its entry, its index there)].
        self.pending: dict[tuple[bytes, int], list[tuple[dict[str, Any], Timestamp, int]]] = {}
        # Chains whose first entry seen links back to entries before it: key -> that prevOpTime ts.
        self.gaps: dict[tuple[bytes, int], Timestamp] = {}

    # -- scope (the server's namespace regexes) ----------------------------------------------------

    def _db_in_scope(self, db: str) -> bool:
        if self.cluster:
            return db not in _INTERNAL_DBS
        return db == self.db

    def _coll_in_scope(self, db: str, coll: str) -> bool:
        if self.single:
            return db == self.db and coll == self.coll
        return self._db_in_scope(db) and not coll.startswith("system.") and not coll.startswith("$")

    # -- entry point -------------------------------------------------------------------------

    def events(self, raw: bytes) -> list[RefEvent]:
        entry = bson.decode(raw, PLAIN)
        op = entry["op"]
        if op == "n":
            return self._noop(entry)
        if op == "c":
            return self._command(entry)
        event = self._write(entry, entry["ts"], entry.get("wall"), 0, None, (entry["ts"], 0))
        return [event] if event is not None else []

    # -- CRUD ------------------------------------------------------------------------------------

    def _write(
        self,
        op: dict[str, Any],
        ts: Timestamp,
        wall: Any,
        txn_op_index: int,
        txn: tuple[Any, Any] | None,
        applied_at: tuple[Timestamp, int],
    ) -> RefEvent | None:
        db, coll = _split(op["ns"])
        if op.get("fromMigrate") and not self.migration:
            return None
        if coll == "system.views":
            return self._view(op, ts, wall, txn_op_index, txn)
        if op["op"] == "c":
            return self._command_in_transaction(op, ts, wall, txn_op_index, txn)
        crud = self._crud_in_scope(op, db, coll)
        if crud is None:
            return None
        op_type, full_document, document_key, update_description = crud
        ui = op.get("ui")
        doc = self._head(txn, None, op_type, ts, ui, wall)
        _set_present(doc, "fullDocument", full_document)
        doc["ns"] = {"db": db, "coll": coll}
        doc["documentKey"] = document_key
        _set_present(doc, "updateDescription", update_description)
        event = self._finish(doc, op_type, db, coll, ts, txn_op_index, ui, document_key, None)
        if ui is not None:
            event.image_key = (bytes(ui), applied_at[0], applied_at[1])
        return event

    def _crud_in_scope(
        self, op: dict[str, Any], db: str, coll: str
    ) -> tuple[str, Any, Any, Any] | None:
        """The CRUD fields of a write to a collection this stream watches (system collections'
        writes make no events)."""
        if not self._coll_in_scope(db, coll) or coll.startswith("system."):
            return None
        return crud_fields(op, self.expanded)

    def _view(
        self,
        op: dict[str, Any],
        ts: Timestamp,
        wall: Any,
        txn_op_index: int,
        txn: tuple[Any, Any] | None,
    ) -> RefEvent | None:
        """A write to system.views, seen by database and cluster streams with expanded events."""
        db, _ = _split(op["ns"])
        if self.single or not self.expanded or not self._db_in_scope(db):
            return None
        fields = view_fields(op)
        if fields is None:
            return None
        op_type, name, desc = fields
        view_db, view = _split(name)
        doc: dict[str, Any] = {"_id": None}  # (the view transform adds no lsid/txnNumber)
        doc["operationType"] = op_type
        doc["clusterTime"] = ts
        _set_present(doc, "wallTime", wall)
        doc["ns"] = {"db": view_db, "coll": view}
        _set_present(doc, "operationDescription", desc)
        return self._finish(doc, op_type, view_db, view, ts, txn_op_index, op.get("ui"), None, desc)

    # -- commands ----------------------------------------------------------------------------------

    def _command(self, entry: dict[str, Any]) -> list[RefEvent]:
        o = entry["o"]
        name = next(iter(o))
        if name == "applyOps":
            return self._apply_ops(entry)
        if name == "commitTransaction":
            return self._commit_prepared(entry)
        if name == "abortTransaction":
            return self._abort(entry)
        if self._hidden_migration_ddl(entry, name):
            return []
        db, _ = _split(entry["ns"])
        event = self._ddl(entry, name, db, entry["ts"], entry.get("wall"), 0, None)
        return [event] if event is not None else []

    def _abort(self, entry: dict[str, object]) -> list[RefEvent]:
        """An aborted transaction's ops are forgotten; it makes no event."""
        self.pending.pop(_txn_key(entry), None)
        self.gaps.pop(_txn_key(entry), None)
        return []

    def _hidden_migration_ddl(self, entry: dict[str, object], name: str) -> bool:
        """A migration's DDL entry this stream does not show. With showSystemEvents, a
        migration's create and createIndexes are shown (change_stream_filter_helpers.cpp
        buildFromMigrateSystemOpFilter)."""
        return bool(
            entry.get("fromMigrate")
            and not self.migration
            and not (self.system_events and name in ("create", "createIndexes"))
        )

    def _command_in_transaction(
        self,
        op: dict[str, Any],
        ts: Timestamp,
        wall: Any,
        txn_op_index: int,
        txn: tuple[Any, Any] | None,
    ) -> RefEvent | None:
        """create and createIndexes run inside a transaction (the server's transaction filter
        admits those two commands among a transaction's ops)."""
        name = next(iter(op["o"]))
        if name not in ("create", "createIndexes"):
            return None
        db, _ = _split(op["ns"])
        return self._ddl(op, name, db, ts, wall, txn_op_index, txn)

    def _ddl(
        self,
        entry: dict[str, Any],
        name: str,
        db: str,
        ts: Timestamp,
        wall: Any,
        txn_op_index: int,
        txn: tuple[Any, Any] | None,
    ) -> RefEvent | None:
        """The event of a DDL entry `name` (of database `db`), or None when the stream does
        not show it."""
        event = {
            "dropDatabase": self._drop_database_event,
            "renameCollection": self._rename_event,
            "drop": self._drop_event,
        }.get(name, self._expanded_ddl_event)
        return event(entry, name, db, ts, wall, txn_op_index, txn)

    def _drop_database_event(
        self,
        entry: dict[str, Any],
        name: str,
        db: str,
        ts: Timestamp,
        wall: Any,
        txn_op_index: int,
        txn: tuple[Any, Any] | None,
    ) -> RefEvent | None:
        if self.single or not self._db_in_scope(db):
            return None
        doc = self._head(txn, None, "dropDatabase", ts, None, wall)
        doc["ns"] = {"db": db}
        return self._finish(doc, "dropDatabase", db, None, ts, txn_op_index, None, None, None)

    def _rename_event(
        self,
        entry: dict[str, Any],
        name: str,
        db: str,
        ts: Timestamp,
        wall: Any,
        txn_op_index: int,
        txn: tuple[Any, Any] | None,
    ) -> RefEvent | None:
        o, ui = entry["o"], entry.get("ui")
        src_db, src = _split(o["renameCollection"])
        dst_db, dst = _split(o["to"])
        if not (self._coll_in_scope(src_db, src) or self._coll_in_scope(dst_db, dst)):
            return None
        to = {"db": dst_db, "coll": dst}
        # The command but renameCollection and stayTemp, its `to` made an ns document in place.
        desc = {k: v for k, v in o.items() if k not in ("renameCollection", "stayTemp")}
        desc["to"] = dict(to)
        doc = self._head(txn, to, "rename", ts, ui, wall)
        doc["ns"] = {"db": src_db, "coll": src}
        if self.expanded:
            doc["operationDescription"] = desc
        return self._finish(doc, "rename", src_db, src, ts, txn_op_index, ui, None, desc)

    def _drop_event(
        self,
        entry: dict[str, Any],
        name: str,
        db: str,
        ts: Timestamp,
        wall: Any,
        txn_op_index: int,
        txn: tuple[Any, Any] | None,
    ) -> RefEvent | None:
        coll, ui = entry["o"]["drop"], entry.get("ui")
        if not self._coll_in_scope(db, coll):
            return None
        doc = self._head(txn, None, "drop", ts, ui, wall)
        doc["ns"] = {"db": db, "coll": coll}
        return self._finish(doc, "drop", db, coll, ts, txn_op_index, ui, None, None)

    def _expanded_ddl_event(
        self,
        entry: dict[str, Any],
        name: str,
        db: str,
        ts: Timestamp,
        wall: Any,
        txn_op_index: int,
        txn: tuple[Any, Any] | None,
    ) -> RefEvent | None:
        """The DDL events only expanded streams show: create, createIndexes, dropIndexes and
        modify."""
        coll, ui = entry["o"][name], entry.get("ui")
        op_type = EXPANDED_DDL.get(name)
        if op_type is None or not self._shows_expanded_ddl(db, coll):
            return None
        described = ddl_description(entry, name)
        if described is None:
            return None
        desc, state_before = described
        doc = self._head(txn, None, op_type, ts, ui, wall)
        doc["ns"] = {"db": db, "coll": coll}
        doc["operationDescription"] = desc
        _set_present(doc, "stateBeforeChange", state_before)
        return self._finish(doc, op_type, db, coll, ts, txn_op_index, ui, None, desc)

    def _shows_expanded_ddl(self, db: str, coll: object) -> bool:
        return self.expanded and isinstance(coll, str) and self._coll_in_scope(db, coll)

    def _head(
        self,
        txn: tuple[Any, Any] | None,
        to: dict[str, Any] | None,
        op_type: str,
        ts: Timestamp,
        ui: Any,
        wall: Any,
    ) -> dict[str, Any]:
        """An event's leading fields in the server's order; `_id` holds its place until the
        token is set."""
        doc: dict[str, Any] = {}
        if txn is not None:
            doc["txnNumber"], doc["lsid"] = txn[1], txn[0]
        _set_present(doc, "to", to)
        doc["_id"] = None
        doc["operationType"] = op_type
        doc["clusterTime"] = ts
        _set_present(doc, "collectionUUID", ui if self.expanded else None)
        _set_present(doc, "wallTime", wall)
        return doc

    # -- noops -------------------------------------------------------------------------------------

    def _noop(self, entry: dict[str, Any]) -> list[RefEvent]:
        o2 = entry.get("o2")
        if not self.expanded or not isinstance(o2, dict):
            return []
        kind = self._noop_kind(entry, o2)
        if kind is None:
            return []
        db, coll = _split(o2[kind])
        if not self._coll_in_scope(db, coll):
            return []
        desc = {k: v for k, v in o2.items() if k != kind}
        ui = entry.get("ui")
        doc = self._head(None, None, kind, entry["ts"], ui, entry.get("wall"))
        doc["ns"] = {"db": db, "coll": coll}
        doc["operationDescription"] = desc
        return [self._finish(doc, kind, db, coll, entry["ts"], 0, ui, None, desc)]

    def _noop_kind(self, entry: dict[str, Any], o2: dict[str, Any]) -> str | None:
        """The event a noop's o2 announces that this stream shows, if any."""
        if entry.get("fromMigrate") and not self.migration:
            return None
        for kind, needs_system_events in _NOOP_EVENTS:
            if kind in o2 and (self.system_events or not needs_system_events):
                return kind
        return None

    # -- transactions ------------------------------------------------------------------------------

    def _apply_ops(self, entry: dict[str, Any]) -> list[RefEvent]:
        o = entry["o"]
        ops = [(op, entry["ts"], i) for i, op in enumerate(o["applyOps"])]
        if not _in_transaction(entry):  # a batched write or a retryable applyOps
            return self._unwind(ops, entry, None)
        key = _txn_key(entry)
        if o.get("partialTxn") or o.get("prepare"):
            return self._hold(key, entry, ops)
        return self._unwind(
            self._earlier_ops(key, entry) + ops, entry, (entry["lsid"], entry["txnNumber"])
        )

    def _hold(
        self, key: tuple[bytes, int], entry: dict[str, Any], ops: list[Any]
    ) -> list[RefEvent]:
        """A transaction's ops before its commit wait for it; the first entry held notes where
        the chain of entries not read begins."""
        if key not in self.pending and (prev := _prev_ts(entry)) is not None:
            self.gaps[key] = prev
        self.pending.setdefault(key, []).extend(ops)
        return []

    def _commit_prepared(self, entry: dict[str, Any]) -> list[RefEvent]:
        key = _txn_key(entry)
        return self._unwind(
            self._earlier_ops(key, entry), entry, (entry["lsid"], entry["txnNumber"])
        )

    def _earlier_ops(self, key: tuple[bytes, int], commit: dict[str, Any]) -> list[Any]:
        """The transaction's ops from its earlier entries: those read, and those before the first
        one read (or before the commit, when none was), found back through prevOpTime."""
        ops = self.pending.pop(key, [])
        through = self.gaps.pop(key, None) if ops else _prev_ts(commit)
        if through is not None:
            earlier: list[Any] = []
            for raw in self.chain(through):
                entry = bson.decode(raw, PLAIN)
                earlier += [(op, entry["ts"], i) for i, op in enumerate(entry["o"]["applyOps"])]
            ops = earlier + ops
        return ops

    def _unwind(
        self,
        ops: list[tuple[dict[str, Any], Timestamp, int]],
        commit: dict[str, Any],
        txn: tuple[Any, Any] | None,
    ) -> list[RefEvent]:
        out = []
        for index, (op, entry_ts, entry_index) in enumerate(ops):  # txnOpIndex counts every op
            event = self._write(
                op, commit["ts"], commit.get("wall"), index, txn, (entry_ts, entry_index)
            )
            if event is not None:
                out.append(event)
        return out

    # -- tokens ----------------------------------------------------------------------------------

    def _token_version(self, ts: Timestamp) -> int:
        """The stream's token version, or the resume token's for events up to the one resumed
        from."""
        resumed = self.resumed_from
        if resumed is not None and not ts > resumed.cluster_time:
            return resumed.version
        return self.version

    def _finish(
        self,
        doc: dict[str, Any],
        op_type: str,
        db: str,
        coll: str | None,
        ts: Timestamp,
        txn_op_index: int,
        ui: Any,
        document_key: Any,
        desc: Any,
    ) -> RefEvent:
        version = self._token_version(ts)
        identifier = _event_identifier(version, op_type, document_key, desc)
        token = encode_token_generic(
            ResumeTokenData(ts, version, EVENT_TOKEN, txn_op_index, False, _uuid(ui), identifier)
        )
        doc["_id"] = token
        return RefEvent(doc, token, token_sort_key(token), ts, op_type, db, coll)


def _set_present(doc: dict[str, object], name: str, value: object) -> None:
    """An event field the server leaves out when it has no value."""
    if value is not None:
        doc[name] = value


def _event_identifier(
    version: int, op_type: str, document_key: Mapping[str, object] | None, desc: object
) -> Mapping[str, object] | None:
    """The token's event identifier: a v1 token of a classic event holds the document key, the
    others the operation type with the document key or the description."""
    if version < 2 and op_type in _CLASSIC:
        return document_key
    identifier: dict[str, object] = {"operationType": op_type}
    if document_key is not None:
        identifier["documentKey"] = document_key
    elif desc is not None:
        identifier["operationDescription"] = desc
    return identifier


def _in_transaction(entry: Mapping[str, object]) -> bool:
    """An applyOps with a transaction's identity (not a batched write or a retryable
    applyOps)."""
    return "lsid" in entry and "txnNumber" in entry and entry.get("multiOpType") != 1


def _txn_key(entry: Mapping[str, Any]) -> tuple[bytes, int]:
    lsid = entry.get("lsid")
    return (bytes(lsid["id"]) if lsid is not None else b"", int(entry.get("txnNumber", -1)))


def _prev_ts(entry: Mapping[str, Any]) -> Timestamp | None:
    """The ts of the previous entry of the transaction's chain; None for its first (null optime)."""
    prev = entry.get("prevOpTime")
    ts = prev.get("ts") if isinstance(prev, Mapping) else None
    return ts if ts is not None and (ts.time or ts.inc) else None
