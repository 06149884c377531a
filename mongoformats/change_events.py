"""Oplog entries -> the change events a MongoDB 7.0/8.0 server emits for them.

Strategy: the entry arrives as raw BSON. Only the top level is inflated (pymongo's C codec keeps
nested documents as `RawBSONDocument` slices), and the event is written back with the C encoder,
which copies those slices; only the few values a resume token needs (documentKey,
operationDescription) are decoded. Transactions are stateful (partialTxn chains, prepared
transactions committed by a later entry), so `OplogTransformer` keeps per-transaction buffers,
bounded by what one transaction can hold.

Sources (facts only): mongodb/mongo src/mongo/db/pipeline/change_stream_event_transform.cpp and
docs/change_stream_events.md, as summarized in shared/reference/mongodb-formats.md C.1-C.11
(field order C.11; tokens A.5).
"""

from __future__ import annotations

import functools
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

import bson
from bson import Timestamp
from bson.raw_bson import RawBSONDocument

from mongoformats.codecs import PLAIN, RAW
from mongoformats.events import (
    EV_APPLIED_AT,
    EV_COLL,
    EV_DB,
    EV_NAMESPACES,
    EV_OP_TYPE,
    EV_RAW,
    EV_SHARD,
    EV_SORT_KEY,
    EV_TYPE_BITS,
    EVENT_BYTES,
    EVENT_SORT_KEY,
    ChangeEvent,
    EventFields,
    _event_from_fields,
    event_token,
    events_from_fields,
    invalidate_event,
)
from mongoformats.oplog_splice import document_of, splice_crud
from mongoformats.resume_token import EVENT_TOKEN, ResumeTokenData, encode_token
from mongoformats.update_diff import update_description_from_diff

__all__ = [
    "EVENT_BYTES",
    "EVENT_SORT_KEY",
    "EV_APPLIED_AT",
    "EV_COLL",
    "EV_DB",
    "EV_NAMESPACES",
    "EV_OP_TYPE",
    "EV_RAW",
    "EV_SHARD",
    "EV_SORT_KEY",
    "EV_TYPE_BITS",
    "PCS_NOTE_KEY",
    "RAW",
    "ChangeEvent",
    "EventFields",
    "OplogTransformer",
    "ddl_note",
    "event_token",
    "events_from_fields",
    "invalidate_event",
    "is_internal_namespace",
    "prev_op_ts",
]


# The key our proxy writes in appendOplogNote payloads that describe DDL (see buckets DDL notes).
PCS_NOTE_KEY = "parallelChangeStreamDDL"

_INTERNAL_DBS = frozenset({"admin", "config", "local"})
_COMMAND_OP = b"\x02op\x00\x02\x00\x00\x00c\x00"  # the element op: "c"


def is_internal_namespace(ns: str) -> bool:
    """admin/config/local and system collections never produce user events."""
    db, _, coll = ns.partition(".")
    return db in _INTERNAL_DBS or coll.startswith("system.")


def _uuid(value: Any) -> uuidlib.UUID | None:
    if value is None:
        return None
    if isinstance(value, uuidlib.UUID):
        return value
    return uuidlib.UUID(bytes=bytes(value))


def _plain(doc: Any) -> Any:
    """Decode a raw sub-document into Python values (types kept: Int64 stays Int64)."""
    if isinstance(doc, RawBSONDocument):
        return bson.decode(doc.raw, PLAIN)
    return doc


def _split_ns(ns: str) -> tuple[str, str]:
    db, _, coll = ns.partition(".")
    return db, coll


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


class OplogTransformer:
    """Turns one shard's oplog entries, in oplog order, into change events.

    Args:
        show_expanded_events: emit create/createIndexes/dropIndexes/modify/shardCollection and the
            expanded fields (collectionUUID, operationDescription, disambiguatedPaths).
        show_migration_events: keep `fromMigrate` writes (hidden by default, like the server).
        show_system_events: with show_expanded_events, emit `migrateLastChunkFromShard` when a
            migration leaves a shard without chunks of a collection (the server shows it only then).
        token_version: 2 for 6.1+ servers (7.0, 8.0); 1 to emulate 4.2-6.0.
        ddl_notes: take the expanded DDL events (create, createIndexes, dropIndexes, modify,
            shardCollection, and views) from our proxy's appendOplogNote records instead of the
            native oplog entries: for servers before 6.0, whose change streams have no expanded
            events. Exactly one of the two sources is used, so they never double up.
        view_events: show writes to system.views as view events. A single-collection stream never
            does (ChangeStreamEventTransformer::getBuilder takes the view transform only when
            `!_isSingleCollStream`, and its namespace regex never matches system.views).
        keep_version: (clusterTime, version) of the token a stream resumed from, when that token
            is of an older version: events up to that time keep its version, as
            ChangeStreamEventTransformation::makeResumeToken does (`(clusterTime >
            _resumeToken.clusterTime) ? changeStreamTokenVersion : _resumeToken.version`), so
            that the resumed event is found again.
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
        # (lsid id bytes, txnNumber) -> ops buffered from partialTxn / prepare entries, each with
        # the ts of its entry and its index there (where the server records its images).
        self._pending_txns: dict[tuple[bytes, int], list[tuple[Any, Timestamp, int]]] = {}
        # Chains whose first entry read links back (prevOpTime) to entries before the read began:
        # (lsid id bytes, txnNumber) -> the ts of the last entry missing.
        self._chain_gaps: dict[tuple[bytes, int], Timestamp] = {}

    def pending_transactions(self) -> int:
        return len(self._pending_txns)

    def missing_chain(self, entry: bytes) -> Timestamp | None:
        """For a transaction's commit entry whose earlier entries (a partialTxn chain, a prepare)
        were before the read began: the ts of the last of them, where the reader walks the chain
        back by prevOpTime, as the server's change stream does when it meets a commit. Else None.

        A stream that starts or resumes inside a transaction's chain needs them: the events all
        carry the commit's time, and their txnOpIndex counts every operation of the chain. The
        reader gives the entries to `adopt_chain`, then transforms the commit as usual."""
        if _COMMAND_OP not in entry:  # a byte search: most entries are not commands
            return None
        doc = RawBSONDocument(entry, RAW)
        if doc["op"] != "c" or "lsid" not in doc:
            return None
        o = doc["o"]
        first = next(iter(o.keys()))
        if first == "applyOps":
            if o.get("partialTxn") or o.get("prepare") or doc.get("multiOpType") == 1:
                return None
        elif first != "commitTransaction":
            return None
        key = self._txn_key(doc)
        if key in self._chain_gaps:
            return self._chain_gaps[key]
        if key in self._pending_txns:
            return None
        return prev_op_ts(doc)

    def adopt_chain(self, entries: list[bytes]) -> None:
        """The entries `missing_chain` asked for, oldest first: their operations go before those
        already buffered for the same transaction."""
        key = None
        ops: list[tuple[Any, Timestamp, int]] = []
        for entry in entries:
            doc = RawBSONDocument(entry, RAW)
            key = self._txn_key(doc)
            ops += [(op, doc["ts"], i) for i, op in enumerate(doc["o"]["applyOps"])]
        if key is not None:
            self._chain_gaps.pop(key, None)
            self._pending_txns[key] = ops + self._pending_txns.get(key, [])

    # -- public entry point ----------------------------------------------------------------------

    def transform(self, entry: bytes | RawBSONDocument) -> list[ChangeEvent]:
        """Events for one oplog entry (most entries give 0 or 1; a committed transaction gives many)."""
        if self.token_version == 2 and self.keep_version is None:
            raw = entry if isinstance(entry, bytes) else bytes(entry.raw)
            fast = splice_crud(raw, expanded=self.show_expanded_events)
            if fast is not None:
                return [_event_from_fields(fast)] if fast else []
        return self.transform_decoded(entry)

    def transform_decoded(self, entry: bytes | RawBSONDocument) -> list[ChangeEvent]:
        """`transform` without the byte-splicing fast path: handles every entry (tests compare the two)."""
        doc = entry if isinstance(entry, RawBSONDocument) else RawBSONDocument(entry, RAW)
        if self.keep_version is not None and _later(doc["ts"], self.keep_version[0]):
            self.keep_version = None  # past the resume time: entries come in oplog order
        op = doc["op"]
        if op == "n":
            return self._noop(doc)
        if op == "c":
            return self._command(doc)
        if doc.get("fromMigrate") and not self.show_migration_events:
            return []
        ev = self._crud(doc, doc["ts"], doc.get("wall"), 0, None)
        return [ev] if ev is not None else []

    # -- CRUD --------------------------------------------------------------------------------------

    def _crud(
        self,
        op_doc: Mapping[str, Any],
        ts: Timestamp,
        wall: Any,
        txn_op_index: int,
        txn: tuple[Any, Any] | None,
    ) -> ChangeEvent | None:
        ns = op_doc["ns"]
        if ns.endswith(".system.views"):
            return self._view_event(op_doc, ts, wall)
        if is_internal_namespace(ns):
            return None
        if op_doc.get("fromMigrate") and not self.show_migration_events:
            return None
        op = op_doc["op"]
        o = op_doc["o"]
        if op == "c":
            # create and createIndexes run inside a transaction: buildTransactionFilter admits
            # them among the ops, and they carry the transaction's lsid/txnNumber
            # (jstests/change_streams/ddl_create_index_txn.js; audit D6a).
            first = next(iter(o.keys()), None)
            if first not in ("create", "createIndexes") or self.ddl_notes:
                return None
            return self._ddl(
                op_doc,
                first,
                o,
                ns.split(".", 1)[0],
                ts=ts,
                wall=wall,
                txn_op_index=txn_op_index,
                txn=txn,
            )
        full_document = update_description = None
        if op == "i":
            op_type = "insert"
            full_document = o
            document_key = op_doc.get("o2") or {"_id": o["_id"]}
        elif op == "u":
            document_key = op_doc["o2"]
            if o.get("$v") == 2:
                op_type = "update"
                update_description = update_description_from_diff(
                    _plain(o["diff"]), disambiguate=self.show_expanded_events
                )
            elif "_id" in o:
                op_type = "replace"
                full_document = o
            else:  # legacy $v:1 {$set, $unset}
                op_type = "update"
                update_description = {
                    "updatedFields": _plain(o.get("$set", {})),
                    "removedFields": list(_plain(o.get("$unset", {}))),
                    "truncatedArrays": [],
                }
        elif op == "d":
            op_type = "delete"
            document_key = o
        else:
            return None
        key = _plain(document_key)
        ui = op_doc.get("ui")
        fields: dict[str, Any] = {"operationType": op_type, "clusterTime": ts}
        if self.show_expanded_events and ui is not None:
            fields["collectionUUID"] = ui
        if wall is not None:
            fields["wallTime"] = wall
        if full_document is not None:
            fields["fullDocument"] = full_document
        db, coll = _split_ns(ns)
        fields["ns"] = {"db": db, "coll": coll}
        fields["documentKey"] = document_key
        if update_description is not None:
            fields["updateDescription"] = update_description
        ident = self._identifier(op_type, key, None, self._version_at(ts))
        return self._finish(ts, txn_op_index, ui, ident, fields, op_type, db, coll, (ns,), txn)

    def _view_event(
        self, op_doc: Mapping[str, Any], ts: Timestamp, wall: Any
    ) -> ChangeEvent | None:
        """6.0+ servers show writes to system.views as view events: an insert as `create`, an update
        (collMod of a view, logged as a replacement) as `modify`, a delete as `drop`. Per
        change_stream_event_transform.cpp (ChangeStreamViewDefinitionEventTransformation), the
        operationDescription is the whole view document but `_id`, and the token carries the `ui`
        of the system.views entry (audit D1, D2, D3)."""
        kinds = {"i": "create", "u": "modify", "d": "drop"}
        if (
            not self.show_expanded_events
            or self.ddl_notes
            or not self.view_events
            or op_doc["op"] not in kinds
        ):
            return None
        o = _plain(op_doc["o"])
        name = (
            o.get("_id")
            if op_doc["op"] != "u"
            else (_plain(op_doc.get("o2")) or {}).get("_id", o.get("_id"))
        )
        if not isinstance(name, str) or "." not in name or (op_doc["op"] == "u" and "$v" in o):
            return None  # not a whole view definition the server would write
        db, coll = _split_ns(name)
        if db in _INTERNAL_DBS:
            return None
        ui = op_doc.get("ui")
        kind = kinds[op_doc["op"]]
        if kind == "drop":
            return self._ddl_event(
                "drop", db, coll, ts, wall, ui, None, show_desc=False, show_uuid=False
            )
        desc = {k: v for k, v in o.items() if k != "_id"}
        return self._ddl_event(kind, db, coll, ts, wall, ui, desc, show_uuid=False)

    # -- commands (DDL, transactions) ------------------------------------------------------------

    def _command(self, doc: RawBSONDocument) -> list[ChangeEvent]:
        o = doc["o"]
        first = next(iter(o.keys()))
        if first == "applyOps":
            return self._apply_ops(doc, o)
        if first == "commitTransaction":
            return self._commit_prepared(doc)
        if first == "abortTransaction":
            self._pending_txns.pop(self._txn_key(doc), None)
            self._chain_gaps.pop(self._txn_key(doc), None)
            return []
        if (
            doc.get("fromMigrate")
            and not self.show_migration_events
            and not (self.show_system_events and first in _SYSTEM_FROM_MIGRATE)
        ):
            return []
        db = doc["ns"].split(".", 1)[0]
        if db in _INTERNAL_DBS:
            return []
        ev = self._ddl(doc, first, o, db)
        return [ev] if ev is not None else []

    def _ddl(
        self,
        doc: Mapping[str, Any],
        first: str,
        o: Mapping[str, Any],
        db: str,
        *,
        ts: Timestamp | None = None,
        wall: Any = None,
        txn_op_index: int = 0,
        txn: tuple[Any, Any] | None = None,
    ) -> ChangeEvent | None:
        """`ts`, `wall`, `txn_op_index` and `txn`: a command inside a transaction's applyOps."""
        if ts is None:
            ts, wall = doc["ts"], doc.get("wall")
        ui = doc.get("ui")
        expanded = self.show_expanded_events
        event = functools.partial(self._ddl_event, txn_op_index=txn_op_index, txn=txn)
        # Collections named system.* make no event (change_stream_filter_helpers.cpp matches these
        # commands' collection against kRegexAllCollections; audit D4).
        named = o.get(first)
        if first in _SYSTEM_FILTERED and isinstance(named, str) and named.startswith("system."):
            return None
        if first == "renameCollection" and all(
            _split_ns(o[k])[1].startswith("system.") for k in ("renameCollection", "to")
        ):
            return None
        if first == "drop":
            coll = o["drop"]
            return event("drop", db, coll, ts, wall, ui, None, show_desc=False)
        if first == "renameCollection":
            src_db, src_coll = _split_ns(o["renameCollection"])
            dst_db, dst_coll = _split_ns(o["to"])
            desc: dict[str, Any] = {"to": {"db": dst_db, "coll": dst_coll}}
            if o.get("dropTarget") is not None:
                desc["dropTarget"] = o["dropTarget"]
            return event(
                "rename",
                src_db,
                src_coll,
                ts,
                wall,
                ui,
                desc,
                to={"db": dst_db, "coll": dst_coll},
                extra_ns=(f"{dst_db}.{dst_coll}",),
            )
        if first == "dropDatabase":
            return event("dropDatabase", db, None, ts, wall, None, None, show_desc=False)
        if not expanded or self.ddl_notes:
            return None  # with ddl_notes the proxy's notes stand for these entries
        if first == "create":
            desc = {k: v for k, v in _plain(o).items() if k != "create"}
            coll = o["create"]
            if (
                "viewOn" in desc
            ):  # views are recorded in system.views; the create entry is the collection
                return None
            return event("create", db, coll, ts, wall, ui, desc)
        if first == "createIndexes":
            spec = {k: v for k, v in _plain(o).items() if k != "createIndexes"}
            return event("createIndexes", db, o["createIndexes"], ts, wall, ui, {"indexes": [spec]})
        if first == "commitIndexBuild":
            return event(
                "createIndexes",
                db,
                o["commitIndexBuild"],
                ts,
                wall,
                ui,
                {"indexes": _plain(o)["indexes"]},
            )
        if first == "dropIndexes":
            return event(
                "dropIndexes", db, o["dropIndexes"], ts, wall, ui, {"indexes": [_plain(doc["o2"])]}
            )
        if first == "collMod":
            desc = {k: v for k, v in _plain(o).items() if k != "collMod"}
            o2 = _plain(doc.get("o2")) or {}
            before = {"collectionOptions": o2.get("collectionOptions_old", {})}
            if "indexOptions_old" in o2:
                before["indexOptions"] = o2["indexOptions_old"]
            return event("modify", db, o["collMod"], ts, wall, ui, desc, state_before=before)
        return None

    def _ddl_event(
        self,
        op_type: str,
        db: str,
        coll: str | None,
        ts: Timestamp,
        wall: Any,
        ui: Any,
        desc: dict[str, Any] | None,
        *,
        show_desc: bool = True,
        to: dict[str, Any] | None = None,
        state_before: dict[str, Any] | None = None,
        extra_ns: tuple[str, ...] = (),
        show_uuid: bool = True,
        txn_op_index: int = 0,
        txn: tuple[Any, Any] | None = None,
    ) -> ChangeEvent:
        fields: dict[str, Any] = {}
        if to is not None:
            fields["to"] = to  # the server adds `to` ahead of `_id` (mongodb-formats.md C.11)
        fields["operationType"] = op_type
        fields["clusterTime"] = ts
        if self.show_expanded_events and ui is not None and show_uuid:
            fields["collectionUUID"] = ui
        if wall is not None:
            fields["wallTime"] = wall
        fields["ns"] = {"db": db, "coll": coll} if coll is not None else {"db": db}
        if self.show_expanded_events and desc is not None and show_desc:
            fields["operationDescription"] = desc
        if state_before is not None and self.show_expanded_events:
            fields["stateBeforeChange"] = state_before
        ident = self._identifier(op_type, None, desc, self._version_at(ts))
        namespaces = ((f"{db}.{coll}",) if coll is not None else ()) + extra_ns
        return self._finish(ts, txn_op_index, ui, ident, fields, op_type, db, coll, namespaces, txn)

    # -- noops -------------------------------------------------------------------------------------

    def _noop(self, doc: RawBSONDocument) -> list[ChangeEvent]:
        o2 = doc.get("o2")
        o = doc.get("o")
        # Sharding's notices: {<event name>: "db.c", ...} in o2, the rest its operationDescription.
        if o2 is not None and self.show_expanded_events:
            # reshardCollection and refineCollectionShardKey too: buildInternalOpFilter admits them
            # and the transform's kNoop case maps them (change_stream_event_transform.cpp; D5).
            for kind, shown in (
                ("shardCollection", not self.ddl_notes),
                ("reshardCollection", not self.ddl_notes),
                ("refineCollectionShardKey", not self.ddl_notes),
                ("migrateLastChunkFromShard", self.show_system_events),
            ):
                if kind in o2 and shown:
                    db, coll = _split_ns(o2[kind])
                    if not self._shown_namespace(db, coll):
                        return []
                    desc = {k: v for k, v in _plain(o2).items() if k != kind}
                    return [
                        self._ddl_event(
                            kind, db, coll, doc["ts"], doc.get("wall"), doc.get("ui"), desc
                        )
                    ]
        if self.ddl_notes and self.show_expanded_events and o is not None and PCS_NOTE_KEY in o:
            note = _plain(o)[PCS_NOTE_KEY]
            db, coll = _split_ns(note["ns"])
            return [
                self._ddl_event(
                    note["op"],
                    db,
                    coll or None,
                    doc["ts"],
                    doc.get("wall"),
                    note.get("ui"),
                    note.get("operationDescription"),
                    state_before=note.get("stateBeforeChange"),
                )
            ]
        return []  # periodic noops, plain appendOplogNote, migrateChunkToNewShard: marks only

    def _shown_namespace(self, db: str, coll: str) -> bool:
        """Whether a stream's namespace regex admits db.coll: buildInternalOpFilter matches
        sharding's noops against it (document_source_change_stream.h: kRegexAllDBs leaves out
        admin, config and local; kRegexAllCollections every system.* collection, and with
        showSystemEvents all but system.js, system.resharding.* and system.buckets.*)."""
        if db in _INTERNAL_DBS or coll.startswith("$"):
            return False
        if not coll.startswith("system."):
            return True
        return self.show_system_events and (
            coll == "system.js" or coll.startswith(_SHOWN_SYSTEM_PREFIXES)
        )

    # -- transactions ------------------------------------------------------------------------------

    @staticmethod
    def _txn_key(doc: Mapping[str, Any]) -> tuple[bytes, int]:
        lsid = doc.get("lsid")
        return (bytes(lsid["id"]) if lsid is not None else b"", int(doc.get("txnNumber", -1)))

    def _apply_ops(self, doc: RawBSONDocument, o: RawBSONDocument) -> list[ChangeEvent]:
        # Each op with where it was written: (op, the entry's ts, its index in the entry).
        ops = [(op, doc["ts"], i) for i, op in enumerate(o["applyOps"])]
        if o.get("partialTxn") or o.get("prepare"):
            key = self._txn_key(doc)
            if key not in self._pending_txns and (prev := prev_op_ts(doc)) is not None:
                self._chain_gaps[key] = prev  # the chain began before this read did
            self._pending_txns.setdefault(key, []).extend(ops)
            return []
        if "lsid" in doc and doc.get("multiOpType") != 1:
            ops = self._pending_txns.pop(self._txn_key(doc), []) + ops
            txn = (doc["lsid"], doc["txnNumber"])
        else:  # batched writes and retryable applyOps carry no transaction identity
            txn = None
        return self._unwind(ops, doc["ts"], doc.get("wall"), txn)

    def _commit_prepared(self, doc: RawBSONDocument) -> list[ChangeEvent]:
        ops = self._pending_txns.pop(self._txn_key(doc), [])
        return self._unwind(ops, doc["ts"], doc.get("wall"), (doc["lsid"], doc["txnNumber"]))

    def _unwind(
        self,
        ops: list[tuple[Any, Timestamp, int]],
        ts: Timestamp,
        wall: Any,
        txn: tuple[Any, Any] | None,
    ) -> list[ChangeEvent]:
        # txnOpIndex counts every operation of the transaction, including ones that make no event.
        out = []
        for index, (op, entry_ts, entry_index) in enumerate(ops):
            ev = self._crud(op, ts, wall, index, txn)
            if ev is not None:
                out.append(
                    ev
                    if (entry_ts, entry_index) == (ts, index)
                    else ev._replace(applied_at=(entry_ts, entry_index))
                )
        return out

    # -- tokens ------------------------------------------------------------------------------------

    def _version_at(self, ts: Timestamp) -> int:
        """The version of the tokens of events at `ts` (see `keep_version`)."""
        keep = self.keep_version
        return keep[1] if keep is not None and not _later(ts, keep[0]) else self.token_version

    @staticmethod
    def _identifier(
        op_type: str, document_key: Any, desc: Any, version: int
    ) -> dict[str, Any] | None:
        if version >= 2 or op_type not in _CLASSIC:
            ident: dict[str, Any] = {"operationType": op_type}
            if document_key is not None:
                ident["documentKey"] = document_key
            elif desc is not None:
                ident["operationDescription"] = desc
            return ident
        return document_key  # v0/v1 classic events: the documentKey itself (absent for DDL)

    def _finish(
        self,
        ts: Timestamp,
        txn_op_index: int,
        ui: Any,
        ident: Any,
        fields: dict[str, Any],
        op_type: str,
        db: str,
        coll: str | None,
        namespaces: tuple[str, ...],
        txn: tuple[Any, Any] | None,
    ) -> ChangeEvent:
        token = encode_token(
            ResumeTokenData(
                ts, self._version_at(ts), EVENT_TOKEN, txn_op_index, False, _uuid(ui), ident
            )
        )
        head: dict[str, Any] = {}
        if "to" in fields:
            head["to"] = fields.pop("to")
        if txn is not None:
            head["txnNumber"] = txn[1]
            head["lsid"] = txn[0]
        raw = bson.encode({"_id": token, **fields})
        if head:
            # These precede _id in the server's events (C.11), but bson.encode always writes a
            # top-level _id first, so the two parts are encoded apart and joined.
            raw = document_of(bson.encode(head)[4:-1] + raw[4:-1])
        return ChangeEvent.for_token(token, op_type, db, coll, raw, namespaces)


def _later(a: Timestamp, b: Timestamp) -> bool:
    return (a.time, a.inc) > (b.time, b.inc)


# With showSystemEvents, these commands are shown also when a migration wrote them
# (change_stream_filter_helpers.cpp buildNotFromMigrateFilter -> buildFromMigrateSystemOpFilter).
_SYSTEM_FROM_MIGRATE = frozenset({"create", "createIndexes"})
_SHOWN_SYSTEM_PREFIXES = ("system.resharding.", "system.buckets.")
_SYSTEM_FILTERED = frozenset(
    {"drop", "create", "createIndexes", "commitIndexBuild", "dropIndexes", "collMod"}
)
_CLASSIC = frozenset(
    {"insert", "update", "replace", "delete", "drop", "rename", "dropDatabase", "invalidate"}
)


def prev_op_ts(entry: bytes | RawBSONDocument) -> Timestamp | None:
    """The ts of the entry before this one in its transaction's chain (prevOpTime), or None for
    the chain's first entry (the null optime)."""
    doc = entry if isinstance(entry, RawBSONDocument) else RawBSONDocument(entry, RAW)
    prev = doc.get("prevOpTime")
    ts = prev["ts"] if prev is not None else None
    return ts if ts is not None and (ts.time or ts.inc) else None
