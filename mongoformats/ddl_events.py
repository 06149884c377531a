"""The DDL events of oplog entries: commands (drop, rename, create, indexes, collMod), writes to
system.views (view events), sharding's noop notices, and our proxy's appendOplogNote records.

Each command has a builder in a table: the entry -> the event's parts (`DdlEvent`) or None.

Sources (facts only): mongodb/mongo src/mongo/db/pipeline/change_stream_event_transform.cpp and
change_stream_filter_helpers.cpp, as summarized in shared/reference/mongodb-formats.md C.1-C.11.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bson.raw_bson import RawBSONDocument

from mongoformats.event_writer import (
    INTERNAL_DBS,
    DdlEvent,
    EventAt,
    EventWriter,
    plain,
    split_ns,
)
from mongoformats.events import ChangeEvent

# The key our proxy writes in appendOplogNote payloads that describe DDL (see buckets DDL notes).
PCS_NOTE_KEY = "parallelChangeStreamDDL"

# Collections named system.* make no event of these commands (change_stream_filter_helpers.cpp
# matches their collection against kRegexAllCollections; audit D4).
_SYSTEM_FILTERED = frozenset(
    {"drop", "create", "createIndexes", "commitIndexBuild", "dropIndexes", "collMod"}
)
# With showSystemEvents, the stream's namespace regex admits these system collections too.
_SHOWN_SYSTEM_PREFIXES = ("system.resharding.", "system.buckets.")
# Sharding's notices, in the order they are looked for in a noop's o2.
_NOTICES = (
    "shardCollection",
    "reshardCollection",
    "refineCollectionShardKey",
    "migrateLastChunkFromShard",
)
# A write to system.views by its op: an insert creates a view, an update (collMod of a view,
# logged as a replacement) modifies it, a delete drops it.
_VIEW_KINDS = {"i": "create", "u": "modify", "d": "drop"}

# (the entry or the op inside a transaction, its `o`, the command's database) -> the event.
DdlBuilder = Callable[[Mapping[str, Any], Mapping[str, Any], str], DdlEvent | None]


def ddl_note(
    op_type: str,
    ns: str,
    *,
    ui: Any = None,
    operation_description: Mapping[str, Any] | None = None,
    state_before_change: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The appendOplogNote `data` our proxy writes to record a DDL command the stream must show."""
    note: dict[str, Any] = {"op": op_type, "ns": ns}
    if ui is not None:
        note["ui"] = ui
    if operation_description is not None:
        note["operationDescription"] = dict(operation_description)
    if state_before_change is not None:
        note["stateBeforeChange"] = dict(state_before_change)
    return {PCS_NOTE_KEY: note}


def _without(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A command's decoded fields but its first (the one naming the collection)."""
    return {k: v for k, v in plain(doc).items() if k != name}


def _drop(doc: Mapping[str, Any], o: Mapping[str, Any], db: str) -> DdlEvent:
    return DdlEvent("drop", db, o["drop"], doc.get("ui"), None, show_desc=False)


def _rename(doc: Mapping[str, Any], o: Mapping[str, Any], db: str) -> DdlEvent:
    src_db, src_coll = split_ns(o["renameCollection"])
    dst_db, dst_coll = split_ns(o["to"])
    desc: dict[str, Any] = {"to": {"db": dst_db, "coll": dst_coll}}
    if o.get("dropTarget") is not None:
        desc["dropTarget"] = o["dropTarget"]
    return DdlEvent(
        "rename",
        src_db,
        src_coll,
        doc.get("ui"),
        desc,
        to={"db": dst_db, "coll": dst_coll},
        extra_ns=(f"{dst_db}.{dst_coll}",),
    )


def _drop_database(doc: Mapping[str, Any], o: Mapping[str, Any], db: str) -> DdlEvent:
    return DdlEvent("dropDatabase", db, None, None, None, show_desc=False)


def _create(doc: Mapping[str, Any], o: Mapping[str, Any], db: str) -> DdlEvent | None:
    desc = _without(o, "create")
    if "viewOn" in desc:
        return None  # views are recorded in system.views; the create entry is the collection
    return DdlEvent("create", db, o["create"], doc.get("ui"), desc)


def _create_indexes(doc: Mapping[str, Any], o: Mapping[str, Any], db: str) -> DdlEvent:
    spec = _without(o, "createIndexes")
    return DdlEvent("createIndexes", db, o["createIndexes"], doc.get("ui"), {"indexes": [spec]})


def _commit_index_build(doc: Mapping[str, Any], o: Mapping[str, Any], db: str) -> DdlEvent:
    desc = {"indexes": plain(o)["indexes"]}
    return DdlEvent("createIndexes", db, o["commitIndexBuild"], doc.get("ui"), desc)


def _drop_indexes(doc: Mapping[str, Any], o: Mapping[str, Any], db: str) -> DdlEvent:
    desc = {"indexes": [plain(doc["o2"])]}
    return DdlEvent("dropIndexes", db, o["dropIndexes"], doc.get("ui"), desc)


def _coll_mod(doc: Mapping[str, Any], o: Mapping[str, Any], db: str) -> DdlEvent:
    desc = _without(o, "collMod")
    o2 = plain(doc.get("o2")) or {}
    before = {"collectionOptions": o2.get("collectionOptions_old", {})}
    if "indexOptions_old" in o2:
        before["indexOptions"] = o2["indexOptions_old"]
    return DdlEvent("modify", db, o["collMod"], doc.get("ui"), desc, state_before=before)


# Shown in every stream.
_COMMANDS: dict[str, DdlBuilder] = {
    "drop": _drop,
    "renameCollection": _rename,
    "dropDatabase": _drop_database,
}
# Shown with showExpandedEvents, from the oplog's own entries (not with ddl_notes, whose notes
# stand for these entries).
_EXPANDED_COMMANDS: dict[str, DdlBuilder] = {
    "create": _create,
    "createIndexes": _create_indexes,
    "commitIndexBuild": _commit_index_build,
    "dropIndexes": _drop_indexes,
    "collMod": _coll_mod,
}


def _on_system_collection(first: str, o: Mapping[str, Any]) -> bool:
    """Whether the command acts on system.* collections only (see _SYSTEM_FILTERED)."""
    if first == "renameCollection":
        return all(split_ns(o[k])[1].startswith("system.") for k in ("renameCollection", "to"))
    named = o.get(first)
    return first in _SYSTEM_FILTERED and isinstance(named, str) and named.startswith("system.")


def _builder(writer: EventWriter, first: str) -> DdlBuilder | None:
    """What builds the event of a command starting with `first`, if the stream shows one: the
    expanded commands only with showExpandedEvents, and not when DDL notes stand for them."""
    build = _COMMANDS.get(first)
    if build is None and writer.show_expanded_events and not writer.ddl_notes:
        return _EXPANDED_COMMANDS.get(first)
    return build


def command_event(
    writer: EventWriter,
    doc: Mapping[str, Any],
    first: str,
    o: Mapping[str, Any],
    db: str,
    at: EventAt,
) -> ChangeEvent | None:
    """The event of a command entry (or of a command inside a transaction's applyOps) whose `o`
    starts with `first`, or None."""
    if _on_system_collection(first, o):
        return None
    build = _builder(writer, first)
    event = build(doc, o, db) if build is not None else None
    return writer.ddl(event, at) if event is not None else None


# -- views -----------------------------------------------------------------------------------------


def view_event(writer: EventWriter, op_doc: Mapping[str, Any], at: EventAt) -> ChangeEvent | None:
    """6.0+ servers show writes to system.views as view events (see _VIEW_KINDS). Per
    change_stream_event_transform.cpp (ChangeStreamViewDefinitionEventTransformation), the
    operationDescription is the whole view document but `_id`, and the token carries the `ui`
    of the system.views entry (audit D1, D2, D3). Never part of a transaction's numbering."""
    kind = _VIEW_KINDS.get(op_doc["op"])
    shown = writer.show_expanded_events and not writer.ddl_notes and writer.view_events
    if kind is None or not shown:
        return None
    event = _view_definition(op_doc, kind)
    return writer.ddl(event, EventAt(at.ts, at.wall)) if event is not None else None


def _view_definition(op_doc: Mapping[str, Any], kind: str) -> DdlEvent | None:
    o = plain(op_doc["o"])
    name = _view_name(op_doc, o)
    if not _is_user_view(name, kind, o):
        return None
    db, coll = split_ns(name)
    ui = op_doc.get("ui")
    if kind == "drop":
        return DdlEvent("drop", db, coll, ui, None, show_desc=False, show_uuid=False)
    desc = {k: v for k, v in o.items() if k != "_id"}
    return DdlEvent(kind, db, coll, ui, desc, show_uuid=False)


def _is_user_view(name: Any, kind: str, o: dict[str, Any]) -> bool:
    """Whether a system.views write is a whole definition the server would show: a view named
    "db.name" outside the internal databases (an update that is a diff is not)."""
    if not isinstance(name, str) or "." not in name or (kind == "modify" and "$v" in o):
        return False
    return split_ns(name)[0] not in INTERNAL_DBS


def _view_name(op_doc: Mapping[str, Any], o: dict[str, Any]) -> Any:
    """The view's "db.name": the document's `_id`, an update's from its o2."""
    if op_doc["op"] != "u":
        return o.get("_id")
    return (plain(op_doc.get("o2")) or {}).get("_id", o.get("_id"))


# -- noops -----------------------------------------------------------------------------------------


def noop_events(writer: EventWriter, doc: RawBSONDocument) -> list[ChangeEvent]:
    """Sharding's notices ({<event name>: "db.c", ...} in o2, the rest its operationDescription)
    and our proxy's DDL notes. Periodic noops, plain appendOplogNote and migrateChunkToNewShard
    are marks only."""
    if not writer.show_expanded_events:
        return []
    at = EventAt(doc["ts"], doc.get("wall"))
    o2 = doc.get("o2")
    if o2 is not None and (kind := _notice_kind(writer, o2)) is not None:
        return _notice_events(writer, doc, o2, kind, at)
    return _note_events(writer, doc.get("o"), at)


def _note_events(
    writer: EventWriter, o: Mapping[str, Any] | None, at: EventAt
) -> list[ChangeEvent]:
    """The event of our proxy's DDL note in a noop's `o`, when the stream takes DDL notes."""
    if writer.ddl_notes and o is not None and PCS_NOTE_KEY in o:
        return [writer.ddl(_noted(plain(o)[PCS_NOTE_KEY]), at)]
    return []


def _notice_kind(writer: EventWriter, o2: Mapping[str, Any]) -> str | None:
    """The first notice in o2 the stream shows. reshardCollection and refineCollectionShardKey
    too: buildInternalOpFilter admits them and the transform's kNoop case maps them
    (change_stream_event_transform.cpp; D5). migrateLastChunkFromShard only with
    showSystemEvents; the others come from ddl_notes instead when those are on."""
    for kind in _NOTICES:
        system = kind == "migrateLastChunkFromShard"
        shown = writer.show_system_events if system else not writer.ddl_notes
        if kind in o2 and shown:
            return kind
    return None


def _notice_events(
    writer: EventWriter, doc: RawBSONDocument, o2: Mapping[str, Any], kind: str, at: EventAt
) -> list[ChangeEvent]:
    db, coll = split_ns(o2[kind])
    if not _shown_namespace(writer, db, coll):
        return []
    desc = _without(o2, kind)
    return [writer.ddl(DdlEvent(kind, db, coll, doc.get("ui"), desc), at)]


def _noted(note: dict[str, Any]) -> DdlEvent:
    """The event one of our proxy's DDL notes (`ddl_note`) records."""
    db, coll = split_ns(note["ns"])
    return DdlEvent(
        note["op"],
        db,
        coll or None,
        note.get("ui"),
        note.get("operationDescription"),
        state_before=note.get("stateBeforeChange"),
    )


def _shown_namespace(writer: EventWriter, db: str, coll: str) -> bool:
    """Whether a stream's namespace regex admits db.coll: buildInternalOpFilter matches
    sharding's noops against it (document_source_change_stream.h: kRegexAllDBs leaves out
    admin, config and local; kRegexAllCollections every system.* collection, and with
    showSystemEvents all but system.js, system.resharding.* and system.buckets.*)."""
    if db in INTERNAL_DBS or coll.startswith("$"):
        return False
    if not coll.startswith("system."):
        return True
    return writer.show_system_events and (
        coll == "system.js" or coll.startswith(_SHOWN_SYSTEM_PREFIXES)
    )
