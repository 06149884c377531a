"""The events of an oplog entry's write (i, u, d), alone or inside a transaction's applyOps:
insert, update, replace and delete, and the DDL a write or a transaction carries (view
definitions, create and createIndexes).

Sources (facts only): mongodb/mongo src/mongo/db/pipeline/change_stream_event_transform.cpp, as
summarized in shared/reference/mongodb-formats.md C.1-C.11.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from mongoformats.ddl_events import command_event, view_event
from mongoformats.event_writer import (
    EventAt,
    EventWriter,
    identifier,
    is_internal_namespace,
    plain,
    split_ns,
)
from mongoformats.events import ChangeEvent
from mongoformats.update_diff import update_description_from_diff

# Commands a transaction may hold that make events: buildTransactionFilter admits them among the
# ops, and they carry the transaction's lsid/txnNumber
# (jstests/change_streams/ddl_create_index_txn.js; audit D6a).
_COMMANDS_IN_TXN = ("create", "createIndexes")


class _Write(NamedTuple):
    """What a write's event shows besides its namespace and time."""

    op_type: str
    document_key: Any
    full_document: Any = None
    update_description: dict[str, Any] | None = None


def _insert(op_doc: Mapping[str, Any], expanded: bool) -> _Write:
    o = op_doc["o"]
    return _Write("insert", op_doc.get("o2") or {"_id": o["_id"]}, full_document=o)


def _update(op_doc: Mapping[str, Any], expanded: bool) -> _Write:
    """An update: a $v:2 diff, a replacement, or a legacy $v:1 {$set, $unset}."""
    key = op_doc["o2"]
    o = op_doc["o"]
    if o.get("$v") == 2:
        diff = plain(o["diff"])
        return _Write(
            "update", key, None, update_description_from_diff(diff, disambiguate=expanded)
        )
    if "_id" in o:
        return _Write("replace", key, full_document=o)
    legacy = {
        "updatedFields": plain(o.get("$set", {})),
        "removedFields": list(plain(o.get("$unset", {}))),
        "truncatedArrays": [],
    }
    return _Write("update", key, None, legacy)


def _delete(op_doc: Mapping[str, Any], expanded: bool) -> _Write:
    return _Write("delete", op_doc["o"])


_WRITES: dict[str, Callable[[Mapping[str, Any], bool], _Write]] = {
    "i": _insert,
    "u": _update,
    "d": _delete,
}


def crud_event(writer: EventWriter, op_doc: Mapping[str, Any], at: EventAt) -> ChangeEvent | None:
    """The event of one write (an entry, or an op of a transaction's applyOps), or None."""
    ns = op_doc["ns"]
    if ns.endswith(".system.views"):
        return view_event(writer, op_doc, at)
    if not _shown(writer, op_doc, ns):
        return None
    op = op_doc["op"]
    if op == "c":
        return _command_in_txn(writer, op_doc, at)
    parts = _WRITES.get(op)
    if parts is None:
        return None
    return _write_event(writer, op_doc, parts(op_doc, writer.show_expanded_events), at)


def _shown(writer: EventWriter, op_doc: Mapping[str, Any], ns: str) -> bool:
    """Internal namespaces never show; a migration's writes only with showMigrationEvents."""
    if is_internal_namespace(ns):
        return False
    return not op_doc.get("fromMigrate") or writer.show_migration_events


def _command_in_txn(
    writer: EventWriter, op_doc: Mapping[str, Any], at: EventAt
) -> ChangeEvent | None:
    o = op_doc["o"]
    first = next(iter(o.keys()), None)
    if first not in _COMMANDS_IN_TXN or writer.ddl_notes:
        return None
    return command_event(writer, op_doc, first, o, op_doc["ns"].split(".", 1)[0], at)


def _write_event(
    writer: EventWriter, op_doc: Mapping[str, Any], write: _Write, at: EventAt
) -> ChangeEvent:
    """The fields in the server's order (mongodb-formats.md C.11), then the token."""
    ns = op_doc["ns"]
    ui = op_doc.get("ui")
    fields: dict[str, Any] = {"operationType": write.op_type, "clusterTime": at.ts}
    if writer.show_expanded_events and ui is not None:
        fields["collectionUUID"] = ui
    if at.wall is not None:
        fields["wallTime"] = at.wall
    if write.full_document is not None:
        fields["fullDocument"] = write.full_document
    db, coll = split_ns(ns)
    fields["ns"] = {"db": db, "coll": coll}
    fields["documentKey"] = write.document_key
    if write.update_description is not None:
        fields["updateDescription"] = write.update_description
    key = plain(write.document_key)
    ident = identifier(write.op_type, key, None, writer.version_at(at.ts))
    return writer.finish(at, ui, ident, fields, write.op_type, db, coll, (ns,))
