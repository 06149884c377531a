"""Writes the real-oplog corpus: oplog entries shaped as a MongoDB 7.0/8.0 mongod writes them, and
the change events a real server emits for them, one JSON file per kind of entry.

Run `PYTHONPATH=$PWD .venv/bin/python -m tests.conformance.oplog_entries.build` to rewrite the
files; tests/unit/test_oplog_corpus.py reads them (it never imports this module). Every value is
written in canonical extended JSON (bson.json_util), so Int32, Int64, Double, UUID and dates keep
their types.

Why a generator: each entry and each expected event is stated here by hand, field by field, in the
server's field order, with the server source it comes from; only the resume tokens' bytes are
computed, by the KeyString codec (`encode_token_generic`, the reference encoder the issue allows
both implementations to share) from the token's stated contents. Nothing here calls the engine's
transform.

Each file: {kind, sources: [server citations for the kind], cases: [{name, options: the
$changeStream fields, source?: the case's own citation, resumeAfter?: a token to resume from,
history?: entries before the read (a transaction's earlier entries), entries, expect: the events,
tokens: whether expect's _id is compared, diverges?: why the engine differs (a strict xfail)}]}.

Shapes of entries (field order: `OplogEntryBase` in src/mongo/db/repl/oplog_entry.idl chains
OperationSessionInfo {lsid, txnNumber}, DurableReplOperation {op, ns, ui, o, o2, ..., stmtId,
fromMigrate}, OpTimeBase {ts, t}, then v, wall, prevOpTime, multiOpType). Events: field order and
contents from `ChangeStreamDefaultEventTransformation::applyTransformation` and
`ChangeStreamViewDefinitionEventTransformation::applyTransformation` in
src/mongo/db/pipeline/change_stream_event_transform.cpp; which entries reach the transform at all
from src/mongo/db/pipeline/change_stream_filter_helpers.cpp (`buildOperationFilter`,
`buildViewDefinitionEventFilter`, `buildTransactionFilter`, `buildInternalOpFilter`,
`buildNotFromMigrateFilter`); a stream without showExpandedEvents keeps only the classic
operation types (`getMatchFilterForClassicOperationTypes`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import pathlib
import uuid as uuidlib
from typing import Any

from bson import Binary, Int64, ObjectId, Timestamp, json_util

from mongoformats.resume_token import EVENT_TOKEN, ResumeTokenData, encode_token_generic

HERE = pathlib.Path(__file__).resolve().parent
JSON = json_util.CANONICAL_JSON_OPTIONS

DB = "shop"
TERM = Int64(3)
VERSION = Int64(2)  # 7.0/8.0 print `v: Long("2")` (mongodb-formats.md C.1)
SECS = 1764115200


def uuid_of(n: int) -> Binary:
    return Binary(uuidlib.UUID(int=(0x5A3E_0000_0000_4000_8000_0000_0000_0000 | n)).bytes, 4)


UI = uuid_of(1)  # shop.orders
ARCHIVE_UI = uuid_of(2)  # shop.archive
VIEWS_UI = uuid_of(3)  # shop.system.views
BUCKETS_UI = uuid_of(4)  # shop.system.buckets.weather
NEW_UI = uuid_of(5)  # a collection created in the case
BUILD_UUID = uuid_of(6)  # an index build
LSID = {"id": uuid_of(8), "uid": Binary(hashlib.sha256(b"").digest(), 0)}
OID = [ObjectId(f"6926a1{n:018x}") for n in range(16)]
ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
NULL_OPTIME = {"ts": Timestamp(0, 0), "t": Int64(-1)}
EXPANDED = {"showExpandedEvents": True}
CLASSIC: dict[str, Any] = {}


def ts(n: int) -> Timestamp:
    return Timestamp(SECS, n)


def wall(n: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(SECS, datetime.UTC) + datetime.timedelta(milliseconds=n)


def entry(
    op: str,
    ns: str,
    o: dict[str, Any],
    at: int,
    *,
    ui: Binary | None = None,
    o2: Any = None,
    txn: int | None = None,
    stmt: Any = None,
    from_migrate: bool = False,
    prev: Any = None,
    multi: int | None = None,
    more: dict[str, Any] | None = None,
    lsid: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An oplog entry in oplog_entry.idl's field order; `more` holds DurableReplOperation's fields
    between o2 and stmtId (rid, needsRetryImage, destinedRecipient), in that order."""
    e: dict[str, Any] = {}
    if txn is not None:
        e["lsid"], e["txnNumber"] = lsid or LSID, Int64(txn)
    e["op"], e["ns"] = op, ns
    if ui is not None:
        e["ui"] = ui
    e["o"] = o
    if o2 is not None:
        e["o2"] = o2
    e.update(more or {})
    if stmt is not None:
        e["stmtId"] = stmt
    if from_migrate:
        e["fromMigrate"] = True
    e["ts"], e["t"], e["v"], e["wall"] = ts(at), TERM, VERSION, wall(at)
    if prev is not None:
        e["prevOpTime"] = prev
    if multi is not None:
        e["multiOpType"] = multi
    return e


def inner(
    op: str, ns: str, o: dict[str, Any], *, ui: Binary | None = UI, o2: Any = None, stmt: Any = None
) -> dict[str, Any]:
    """An operation inside an applyOps (a ReplOperation: DurableReplOperation's fields)."""
    e: dict[str, Any] = {"op": op, "ns": ns}
    if ui is not None:
        e["ui"] = ui
    e["o"] = o
    if o2 is not None:
        e["o2"] = o2
    if stmt is not None:
        e["stmtId"] = stmt
    return e


def optime(at: int) -> dict[str, Any]:
    return {"ts": ts(at), "t": TERM}


def event(
    op_type: str,
    at: int,
    coll: str | None,
    *,
    ui: Binary | None,
    expanded: bool,
    db: str = DB,
    txn_index: int | None = None,
    txn: int | None = None,
    full: Any = None,
    key: Any = None,
    desc: Any = None,
    update: Any = None,
    before: Any = None,
    to: Any = None,
    view: bool = False,
    wall_at: int | None = None,
    lsid: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The event applyTransformation builds, field by field in its addField order: `to` (rename)
    and the transaction's txnNumber, lsid come before _id; collectionUUID only with
    showExpandedEvents and never on view events; operationDescription only with showExpandedEvents
    (always on view events, which only such streams see); the token's eventIdentifier is
    {operationType, documentKey} or else {operationType, operationDescription}, with the
    operationDescription whether or not the event shows it (makeResumeToken)."""
    ident: dict[str, Any] = {"operationType": op_type}
    if key is not None:
        ident["documentKey"] = key
    elif desc is not None:
        ident["operationDescription"] = desc
    token = encode_token_generic(
        ResumeTokenData(
            ts(at),
            2,
            EVENT_TOKEN,
            txn_index or 0,
            False,
            uuidlib.UUID(bytes=bytes(ui)) if ui is not None else None,
            ident,
        )
    )
    ev: dict[str, Any] = {}
    if to is not None:
        ev["to"] = to
    if txn is not None:
        ev["txnNumber"], ev["lsid"] = Int64(txn), lsid or LSID
    ev["_id"] = token
    ev["operationType"] = op_type
    ev["clusterTime"] = ts(at)
    if expanded and ui is not None and not view:
        ev["collectionUUID"] = ui
    ev["wallTime"] = wall(at if wall_at is None else wall_at)
    if full is not None:
        ev["fullDocument"] = full
    ev["ns"] = {"db": db, "coll": coll} if coll is not None else {"db": db}
    if key is not None:
        ev["documentKey"] = key
    if desc is not None and (expanded or view):
        ev["operationDescription"] = desc
    if update is not None:
        ev["updateDescription"] = update
    if before is not None:
        ev["stateBeforeChange"] = before
    return ev


def case(
    name: str,
    entries: list[dict[str, Any]],
    expect: list[dict[str, Any]],
    *,
    options: Any = None,
    source: str = "",
    history: list[dict[str, Any]] | None = None,
    diverges: str | None = None,
    tokens: bool = True,
    resume: Any = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "options": EXPANDED if options is None else options}
    if source:
        out["source"] = source
    if resume is not None:
        out["resumeAfter"] = resume
    if history:
        out["history"] = history
    out["entries"] = entries
    out["expect"] = expect
    out["tokens"] = tokens
    if diverges:
        out["diverges"] = diverges
    return out


def both(
    name: str,
    entries: list[dict[str, Any]],
    make: Any,
    *,
    source: str = "",
    diverges: dict[bool, str] | None = None,
    **kw: Any,
) -> list[dict[str, Any]]:
    """The case on a stream with showExpandedEvents and on a classic one: `make(expanded)` gives
    the expected events."""
    return [
        case(
            f"{name}-{'expanded' if x else 'classic'}",
            entries,
            make(x),
            options=EXPANDED if x else CLASSIC,
            source=source,
            diverges=(diverges or {}).get(x),
            **kw,
        )
        for x in (True, False)
    ]


def ns(coll: str) -> str:
    return f"{DB}.{coll}"


CMD = f"{DB}.$cmd"
ORDERS = ns("orders")

SYSTEM = {"showExpandedEvents": True, "showSystemEvents": True}


def upd(
    updated: dict[str, Any],
    removed: list[str] | None = None,
    truncated: list[Any] | None = None,
    *,
    expanded: bool,
    paths: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An updateDescription (applyTransformation's kUpdate case): disambiguatedPaths only with
    showExpandedEvents, {} when no path is ambiguous."""
    out: dict[str, Any] = {
        "updatedFields": updated,
        "removedFields": removed or [],
        "truncatedArrays": truncated or [],
    }
    if expanded:
        out["disambiguatedPaths"] = paths or {}
    return out


# -- kinds ---------------------------------------------------------------------------------------

INSERT_SOURCES = [
    "src/mongo/db/op_observer/op_observer_impl.cpp OpObserverImpl::onInserts: one entry per "
    "document, "
    "o = the document, o2 = its document key (shard key fields, then _id; 5.3+)",
    "src/mongo/db/repl/oplog_entry.idl: field order lsid, txnNumber, op, ns, ui, o, o2, stmtId, "
    "fromMigrate, ts, t, v, wall, prevOpTime",
    "change_stream_event_transform.cpp applyTransformation case kInsert: fullDocument = o, "
    "documentKey = o2",
    "change_stream_filter_helpers.cpp buildOperationFilter: CRUD only on nsRegex (no "
    "admin/config/local, "
    "no system.*); buildNotFromMigrateFilter: fromMigrate != true",
]


def inserts() -> dict[str, Any]:
    cases = []
    for name, key, doc in (
        ("objectid-id", {"_id": OID[0]}, {"_id": OID[0], "sku": "A-1", "qty": 2}),
        ("int32-id", {"_id": 7}, {"_id": 7, "sku": "A-7"}),
        (
            "int64-id",
            {"_id": Int64(9007199254740993)},
            {"_id": Int64(9007199254740993), "sku": "big"},
        ),
        ("double-id", {"_id": 2.0}, {"_id": 2.0, "sku": "dbl"}),
        ("string-id", {"_id": "order-1"}, {"_id": "order-1", "sku": "str"}),
        ("sharded-key", {"region": "eu", "_id": OID[1]}, {"_id": OID[1], "region": "eu", "qty": 1}),
    ):
        e = entry("i", ORDERS, doc, 10, ui=UI, o2=key)
        cases += both(
            f"insert-{name}",
            [e],
            lambda x, k=key, d=doc: [
                event("insert", 10, "orders", ui=UI, expanded=x, full=d, key=k)
            ],
        )
    retry = entry(
        "i",
        ORDERS,
        {"_id": OID[2], "sku": "R"},
        11,
        ui=UI,
        o2={"_id": OID[2]},
        txn=4,
        stmt=0,
        prev=NULL_OPTIME,
    )
    cases += both(
        "insert-retryable-write",
        [retry],
        lambda x: [
            event(
                "insert",
                11,
                "orders",
                ui=UI,
                expanded=x,
                full={"_id": OID[2], "sku": "R"},
                key={"_id": OID[2]},
            )
        ],
        source="a retryable write's entry carries lsid, txnNumber, stmtId and prevOpTime; the "
        "event has no "
        "lsid/txnNumber (addTransactionIdFieldsIfPresent runs only for unwound transaction ops)",
    )
    cases += both(
        "insert-recordIdsReplicated",
        [
            entry(
                "i",
                ORDERS,
                {"_id": OID[7], "n": 1},
                19,
                ui=UI,
                o2={"_id": OID[7]},
                more={"rid": Int64(17)},
            )
        ],
        lambda x: [
            event(
                "insert",
                19,
                "orders",
                ui=UI,
                expanded=x,
                full={"_id": OID[7], "n": 1},
                key={"_id": OID[7]},
            )
        ],
        source="8.0 collections created with recordIdsReplicated: true log each write's RecordId "
        "as `rid` "
        "after o2 (oplog_entry.idl DurableReplOperation.rid); the transform does not read it",
    )
    cases += both(
        "insert-many-in-a-row",
        [
            entry("i", ORDERS, {"_id": OID[3 + i], "n": i}, 12 + i, ui=UI, o2={"_id": OID[3 + i]})
            for i in range(3)
        ],
        lambda x: [
            event(
                "insert",
                12 + i,
                "orders",
                ui=UI,
                expanded=x,
                full={"_id": OID[3 + i], "n": i},
                key={"_id": OID[3 + i]},
            )
            for i in range(3)
        ],
    )
    internal: tuple[tuple[str, str, dict[str, Any]], ...] = (
        ("system-js", ns("system.js"), {"_id": "f", "value": "x"}),
        ("admin-users", "admin.system.users", {"_id": "admin.u", "user": "u"}),
        ("config-sessions", "config.system.sessions", {"_id": {"id": uuid_of(9)}}),
        ("local-db", "local.startup_log", {"_id": "h-1"}),
    )
    for name, nsx, doc in internal:
        e = entry("i", nsx, doc, 20, ui=uuid_of(20), o2={"_id": doc["_id"]})
        cases += both(f"insert-{name}-no-event", [e], lambda x: [])
    reshard_tmp = ns("system.resharding.5a3e0000-0000-4000-8000-000000000001")
    cases += both(
        "insert-resharding-temporary-collection-no-event",
        [entry("i", reshard_tmp, {"_id": OID[9]}, 22, ui=uuid_of(25), o2={"_id": OID[9]})],
        lambda x: [],
        source="a resharding recipient fills <db>.system.resharding.<uuid> "
        "(resharding_recipient_service.cpp); nsRegex excludes system.*",
    )
    cases += both(
        "insert-fromMigrate-no-event",
        [entry("i", ORDERS, {"_id": OID[6]}, 21, ui=UI, o2={"_id": OID[6]}, from_migrate=True)],
        lambda x: [],
        source="a chunk migration's recipient inserts with fromMigrate: true "
        "(migration_destination_manager.cpp)",
    )
    return {"kind": "insert", "sources": INSERT_SOURCES, "cases": cases}


UPDATE_SOURCES = [
    "src/mongo/db/update/document_diff_serialization.h: $v:2 diff sections d (delete), u (update), "
    "i (insert), s<field> (sub-diff); array diffs {a: true, l: <new size>, u<index>: value, "
    "s<index>: sub-diff}",
    "op_observer_impl.cpp OpObserverImpl::onUpdate: o = {$v: 2, diff} for a delta, the whole "
    "document "
    "for a replacement; o2 = the document key",
    "change_stream_event_transform.cpp case kUpdate: $v 2 -> update with "
    "change_stream_document_diff_parser::parseDiff; o with _id and no $v -> replace with "
    "fullDocument = o; "
    "documentKey = o2",
    "src/mongo/db/pipeline/change_stream_document_diff_parser.cpp "
    "buildUpdateDescriptionWithDeltaOplog: "
    "updates, then inserts (updatedFields), then deletes (removedFields), then sub-diffs; array "
    "`l` -> "
    "truncatedArrays {field, newSize}; _appendFieldToPath: an array index alone is not ambiguous, "
    "a numeric "
    "field is ambiguous only after the first path component, a dotted field always",
    "jstests/change_streams/expanded_update_description.js: 'a path which only contains non-dotted "
    "fields "
    "and array indices is not reported under disambiguatedPaths'",
]


def updates() -> dict[str, Any]:
    cases = []
    key = {"_id": OID[0]}

    def diff_case(
        name: str,
        diff: dict[str, Any],
        make: Any,
        at: int = 30,
        diverges: dict[bool, str] | None = None,
        o2: Any = None,
    ) -> None:
        k = o2 or key
        e = entry("u", ORDERS, {"$v": 2, "diff": diff}, at, ui=UI, o2=k)
        cases.extend(
            both(
                f"update-{name}",
                [e],
                lambda x: [event("update", at, "orders", ui=UI, expanded=x, key=k, update=make(x))],
                diverges=diverges,
            )
        )

    diff_case(
        "u-section",
        {"u": {"status": "shipped", "qty": Int64(3)}},
        lambda x: upd({"status": "shipped", "qty": Int64(3)}, expanded=x),
    )
    diff_case("i-section", {"i": {"note": "gift"}}, lambda x: upd({"note": "gift"}, expanded=x))
    diff_case("d-section", {"d": {"coupon": False}}, lambda x: upd({}, ["coupon"], expanded=x))
    diff_case(
        "d-u-i-sections",
        {"d": {"coupon": False}, "u": {"status": "paid"}, "i": {"paidAt": wall(5)}},
        lambda x: upd({"status": "paid", "paidAt": wall(5)}, ["coupon"], expanded=x),
    )
    diff_case(
        "nested-object",
        {"sshipping": {"d": {"eta": False}, "u": {"city": "Lyon"}, "i": {"zip": "69001"}}},
        lambda x: upd(
            {"shipping.city": "Lyon", "shipping.zip": "69001"}, ["shipping.eta"], expanded=x
        ),
    )
    diff_case(
        "deeply-nested-object",
        {"sa": {"sb": {"sc": {"u": {"d": 1.5}}}}},
        lambda x: upd({"a.b.c.d": 1.5}, expanded=x),
    )
    diff_case(
        "array-set-element",
        {"sitems": {"a": True, "u1": {"sku": "B", "qty": 2}}},
        lambda x: upd({"items.1": {"sku": "B", "qty": 2}}, expanded=x),
    )
    diff_case(
        "array-append",
        {"sitems": {"a": True, "u3": "d"}},
        lambda x: upd({"items.3": "d"}, expanded=x),
    )
    diff_case(
        "array-truncate",
        {"sitems": {"a": True, "l": 2}},
        lambda x: upd({}, [], [{"field": "items", "newSize": 2}], expanded=x),
    )
    diff_case(
        "array-truncate-and-set",
        {"sitems": {"a": True, "l": 3, "u2": "c"}},
        lambda x: upd({"items.2": "c"}, [], [{"field": "items", "newSize": 3}], expanded=x),
    )
    diff_case(
        "array-element-subdiff",
        {"sitems": {"a": True, "s0": {"u": {"qty": 5}, "d": {"gift": False}}}},
        lambda x: upd({"items.0.qty": 5}, ["items.0.gift"], expanded=x),
    )
    diff_case(
        "array-in-array",
        {"smatrix": {"a": True, "s1": {"a": True, "u0": 9}}},
        lambda x: upd({"matrix.1.0": 9}, expanded=x),
    )
    diff_case(
        "numeric-field-in-object",
        {"sbyDay": {"u": {"1": 10}}},
        lambda x: upd({"byDay.1": 10}, expanded=x, paths={"byDay.1": ["byDay", "1"]}),
    )
    diff_case(
        "numeric-field-then-array-index",
        {"sm": {"s1": {"a": True, "u0": "x"}}},
        lambda x: upd({"m.1.0": "x"}, expanded=x, paths={"m.1.0": ["m", "1", 0]}),
    )
    diff_case(
        "leading-numeric-field", {"u": {"0": "zero"}}, lambda x: upd({"0": "zero"}, expanded=x)
    )
    diff_case(
        "dotted-field",
        {"u": {"a.b": 1}},
        lambda x: upd({"a.b": 1}, expanded=x, paths={"a.b": ["a.b"]}),
    )
    diff_case(
        "ambiguous-paths-order",
        {"d": {"x.y": False}, "u": {"a.b": 1}},
        lambda x: upd({"a.b": 1}, ["x.y"], expanded=x, paths={"a.b": ["a.b"], "x.y": ["x.y"]}),
    )
    diff_case(
        "sharded-document-key",
        {"u": {"qty": 4}},
        lambda x: upd({"qty": 4}, expanded=x),
        o2={"region": "eu", "_id": OID[1]},
    )
    replacement = {"_id": OID[0], "sku": "A-1", "qty": 9}
    cases += both(
        "replace",
        [entry("u", ORDERS, replacement, 31, ui=UI, o2=key)],
        lambda x: [event("replace", 31, "orders", ui=UI, expanded=x, full=replacement, key=key)],
    )
    cases += both(
        "update-retryable-write",
        [
            entry(
                "u",
                ORDERS,
                {"$v": 2, "diff": {"u": {"qty": 1}}},
                32,
                ui=UI,
                o2=key,
                txn=6,
                stmt=0,
                prev=NULL_OPTIME,
            )
        ],
        lambda x: [
            event(
                "update",
                32,
                "orders",
                ui=UI,
                expanded=x,
                key=key,
                update=upd({"qty": 1}, expanded=x),
            )
        ],
    )
    cases += both(
        "update-findAndModify-needsRetryImage",
        [
            entry(
                "u",
                ORDERS,
                {"$v": 2, "diff": {"u": {"qty": 5}}},
                35,
                ui=UI,
                o2=key,
                txn=6,
                stmt=1,
                prev=optime(32),
                more={"needsRetryImage": "postImage"},
            )
        ],
        lambda x: [
            event(
                "update",
                35,
                "orders",
                ui=UI,
                expanded=x,
                key=key,
                update=upd({"qty": 5}, expanded=x),
            )
        ],
        source="a retryable findAndModify (5.1+) logs needsRetryImage instead of a separate image "
        "entry (op_observer_impl.cpp OpObserverImpl::onUpdate / onDelete: setNeedsRetryImage when "
        "the image goes to config.image_collection)",
    )
    cases += both(
        "update-during-resharding-destinedRecipient",
        [
            entry(
                "u",
                ORDERS,
                {"$v": 2, "diff": {"u": {"qty": 6}}},
                36,
                ui=UI,
                o2=key,
                more={"destinedRecipient": "shard1"},
            )
        ],
        lambda x: [
            event(
                "update",
                36,
                "orders",
                ui=UI,
                expanded=x,
                key=key,
                update=upd({"qty": 6}, expanded=x),
            )
        ],
        source="while a collection is resharded, each write names its destinedRecipient "
        "(op_observer_impl.cpp, resharding::getDestinedRecipient)",
    )
    cases += both(
        "update-config-sessions-no-event",
        [
            entry(
                "u",
                "config.system.sessions",
                {"$v": 2, "diff": {"u": {"lastUse": wall(1)}}},
                33,
                ui=uuid_of(21),
                o2={"_id": {"id": uuid_of(9)}},
            )
        ],
        lambda x: [],
    )
    cases += both(
        "update-fromMigrate-no-event",
        [
            entry(
                "u",
                ORDERS,
                {"$v": 2, "diff": {"u": {"qty": 1}}},
                34,
                ui=UI,
                o2=key,
                from_migrate=True,
            )
        ],
        lambda x: [],
    )
    return {"kind": "update", "sources": UPDATE_SOURCES, "cases": cases}


def deletes() -> dict[str, Any]:
    cases = []
    for name, key in (
        ("objectid-id", {"_id": OID[0]}),
        ("sharded-key", {"region": "eu", "_id": OID[1]}),
    ):
        cases += both(
            f"delete-{name}",
            [entry("d", ORDERS, key, 40, ui=UI)],
            lambda x, k=key: [event("delete", 40, "orders", ui=UI, expanded=x, key=k)],
        )
    cases += both(
        "delete-retryable-write",
        [entry("d", ORDERS, {"_id": OID[2]}, 41, ui=UI, txn=7, stmt=0, prev=NULL_OPTIME)],
        lambda x: [event("delete", 41, "orders", ui=UI, expanded=x, key={"_id": OID[2]})],
    )
    cases += both(
        "delete-findAndModify-needsRetryImage",
        [
            entry(
                "d",
                ORDERS,
                {"_id": OID[4]},
                44,
                ui=UI,
                txn=7,
                stmt=1,
                prev=optime(41),
                more={"needsRetryImage": "preImage"},
            )
        ],
        lambda x: [event("delete", 44, "orders", ui=UI, expanded=x, key={"_id": OID[4]})],
    )
    cases += both(
        "delete-fromMigrate-no-event",
        [entry("d", ORDERS, {"_id": OID[3]}, 42, ui=UI, from_migrate=True)],
        lambda x: [],
        source="the range deleter and a migration's donor delete with fromMigrate: true",
    )
    cases += both(
        "delete-system-collection-no-event",
        [entry("d", ns("system.js"), {"_id": "f"}, 43, ui=uuid_of(20))],
        lambda x: [],
    )
    return {
        "kind": "delete",
        "cases": cases,
        "sources": [
            "op_observer_impl.cpp OpObserverImpl::onDelete: o = the document key (shard key "
            "fields, then _id)",
            "change_stream_event_transform.cpp case kDelete: documentKey = o",
        ],
    }


ADMIN_CMD = "admin.$cmd"
TXN_SOURCES = [
    "src/mongo/db/op_observer/op_observer_impl.cpp (onUnpreparedTransactionCommit, "
    "onTransactionPrepare, "
    "onBatchedWriteCommit) and src/mongo/db/transaction/transaction_operations.cpp: a "
    "transaction's "
    "operations are logged in applyOps entries on admin.$cmd carrying lsid, txnNumber and "
    "prevOpTime "
    "(the null optime {ts: Timestamp(0, 0), t: -1} for the first); all but the last of a large "
    "transaction have partialTxn: true, the last has count (NumberLong: "
    "transaction_operations.cpp, 'lastOp && !firstOp'); a prepared transaction's last applyOps "
    "has "
    "prepare: true and a later commitTransaction {commitTransaction: 1, commitTimestamp} or "
    "abortTransaction {abortTransaction: 1} entry ends it",
    "batched writes (multi-deletes, 6.1+) log one applyOps without lsid/txnNumber; a retryable "
    "write "
    "whose operations must be applied separately carries multiOpType: 1 "
    "(kApplyOpsAppliedSeparately, "
    "oplog_entry.idl MultiOplogEntryType)",
    "document_source_change_stream_unwind_transaction.cpp TransactionOpIterator: every op's event "
    "has the "
    "committing entry's ts and wall; txnOpIndex counts every operation of the transaction, those "
    "the "
    "filter drops included; lsid/txnNumber are added (before _id, addTransactionIdFieldsIfPresent) "
    "unless the entry has none or has multiOpType 1",
    "change_stream_filter_helpers.cpp buildTransactionFilter: applyOps that are neither prepare "
    "nor "
    "partialTxn, matched on o.applyOps.ns, on o.create / o.createIndexes command ops, or on a "
    "non-null "
    "prevOpTime; commitTransaction entries",
]


def txn_entry(
    ops: list[dict[str, Any]],
    at: int,
    *,
    txn: int | None = 5,
    prev: Any = NULL_OPTIME,
    multi: int | None = None,
    lsid: dict[str, Any] | None = None,
    **flags: Any,
) -> dict[str, Any]:
    return entry(
        "c",
        ADMIN_CMD,
        {"applyOps": ops, **flags},
        at,
        txn=txn,
        prev=prev if txn is not None else None,
        multi=multi,
        lsid=lsid,
    )


def transactions() -> dict[str, Any]:
    cases = []
    k0, k1, k2 = ({"_id": OID[i]} for i in range(3))
    crud = [
        inner("i", ORDERS, {"_id": OID[0], "qty": 1}, o2=k0),
        inner("u", ORDERS, {"$v": 2, "diff": {"u": {"qty": 2}}}, o2=k1),
        inner("d", ORDERS, k2),
    ]

    def crud_events(
        x: bool, at: int, txn: int | None, start: int = 0, wall_at: int | None = None
    ) -> list[Any]:
        return [
            event(
                "insert",
                at,
                "orders",
                ui=UI,
                expanded=x,
                txn_index=start,
                txn=txn,
                full=crud[0]["o"],
                key=k0,
                wall_at=wall_at,
            ),
            event(
                "update",
                at,
                "orders",
                ui=UI,
                expanded=x,
                txn_index=start + 1,
                txn=txn,
                key=k1,
                update=upd({"qty": 2}, expanded=x),
                wall_at=wall_at,
            ),
            event(
                "delete",
                at,
                "orders",
                ui=UI,
                expanded=x,
                txn_index=start + 2,
                txn=txn,
                key=k2,
                wall_at=wall_at,
            ),
        ]

    cases += both("txn-applyOps-with-lsid", [txn_entry(crud, 50)], lambda x: crud_events(x, 50, 5))
    mixed = [
        inner("i", ORDERS, {"_id": OID[0]}, o2=k0),
        inner("i", ns("system.js"), {"_id": "f"}, ui=uuid_of(20), o2={"_id": "f"}),
        inner("i", "config.system.sessions", {"_id": 1}, ui=uuid_of(21), o2={"_id": 1}),
        inner("i", "inventory.items", {"_id": OID[1]}, ui=uuid_of(22), o2=k1),
    ]
    cases += both(
        "txn-filtered-ops-still-counted",
        [txn_entry(mixed, 51)],
        lambda x: [
            event(
                "insert",
                51,
                "orders",
                ui=UI,
                expanded=x,
                txn_index=0,
                txn=5,
                full={"_id": OID[0]},
                key=k0,
            ),
            event(
                "insert",
                51,
                "items",
                ui=uuid_of(22),
                expanded=x,
                txn_index=3,
                txn=5,
                full={"_id": OID[1]},
                key=k1,
                db="inventory",
            ),
        ],
    )
    batched = [inner("d", ORDERS, {"_id": OID[i]}) for i in range(3)]
    cases += both(
        "batched-deletes-applyOps-without-lsid",
        [txn_entry(batched, 52, txn=None)],
        lambda x: [
            event("delete", 52, "orders", ui=UI, expanded=x, txn_index=i, key={"_id": OID[i]})
            for i in range(3)
        ],
    )
    vectored = [inner("i", ORDERS, {"_id": OID[i]}, o2={"_id": OID[i]}, stmt=i) for i in range(2)]
    cases += both(
        "retryable-applyOps-multiOpType-1",
        [txn_entry(vectored, 53, txn=8, multi=1)],
        lambda x: [
            event(
                "insert",
                53,
                "orders",
                ui=UI,
                expanded=x,
                txn_index=i,
                full={"_id": OID[i]},
                key={"_id": OID[i]},
            )
            for i in range(2)
        ],
    )
    more_vectored = [
        inner("i", ORDERS, {"_id": OID[i]}, o2={"_id": OID[i]}, stmt=i) for i in range(2, 4)
    ]
    cases += both(
        "retryable-applyOps-multiOpType-1-linked-by-prevOpTime",
        [
            txn_entry(vectored, 53, txn=8, multi=1),
            txn_entry(more_vectored, 55, txn=8, multi=1, prev=optime(53)),
        ],
        lambda x: [
            event(
                "insert",
                at,
                "orders",
                ui=UI,
                expanded=x,
                txn_index=i % 2,
                full={"_id": OID[i]},
                key={"_id": OID[i]},
            )
            for at, i in ((53, 0), (53, 1), (55, 2), (55, 3))
        ],
        source="TransactionOpIterator: an applyOps with multiOpType kApplyOpsAppliedSeparately is "
        "never "
        "joined to the entries its prevOpTime names",
    )
    ddl = [
        inner("c", CMD, {"create": "fresh", "idIndex": ID_INDEX}, ui=NEW_UI),
        inner(
            "c",
            CMD,
            {"createIndexes": "fresh", "v": 2, "key": {"unused": 1}, "name": "unused_1"},
            ui=NEW_UI,
        ),
        inner("i", ns("fresh"), {"_id": 1}, ui=NEW_UI, o2={"_id": 1}),
    ]
    cases += both(
        "txn-create-createIndexes-insert",
        [txn_entry(ddl, 54)],
        lambda x: [
            *(
                [
                    event(
                        "create",
                        54,
                        "fresh",
                        ui=NEW_UI,
                        expanded=x,
                        txn_index=0,
                        txn=5,
                        desc={"idIndex": ID_INDEX},
                    ),
                    event(
                        "createIndexes",
                        54,
                        "fresh",
                        ui=NEW_UI,
                        expanded=x,
                        txn_index=1,
                        txn=5,
                        desc={"indexes": [{"v": 2, "key": {"unused": 1}, "name": "unused_1"}]},
                    ),
                ]
                if x
                else []
            ),
            event(
                "insert",
                54,
                "fresh",
                ui=NEW_UI,
                expanded=x,
                txn_index=2,
                txn=5,
                full={"_id": 1},
                key={"_id": 1},
            ),
        ],
        source="jstests/change_streams/ddl_create_index_txn.js: create then createIndexes events, "
        "with lsid "
        "and txnNumber, for a createIndex on a new collection inside a transaction",
    )

    # partialTxn chains: three entries linked by prevOpTime, the last commits.
    p1 = txn_entry(crud[:1], 60, partialTxn=True)
    p2 = txn_entry(crud[1:2], 61, prev=optime(60), partialTxn=True)
    p3 = txn_entry(crud[2:], 62, prev=optime(61), count=Int64(3))
    cases += both("partialTxn-chain", [p1, p2, p3], lambda x: crud_events(x, 62, 5))
    cases += both(
        "partialTxn-chain-begun-before-the-read",
        [p2, p3],
        lambda x: crud_events(x, 62, 5),
        history=[p1],
        source="the reader starts after the chain's first entry: the server's change stream reads "
        "the chain back by prevOpTime (TransactionOpIterator::_lookUpOplogEntryByOpTime)",
    )
    resumed = (
        "resumed from the token of an event inside the transaction: the reader starts at its "
        "clusterTime and the events up to and including it are not returned again "
        "(document_source_change_stream_ensure_resume_token_present.cpp, "
        "compareAgainstClientResumeToken: same clusterTime, then txnOpIndex)"
    )
    cases += both(
        "partialTxn-chain-resumed-inside-the-transaction",
        [p3],
        lambda x: crud_events(x, 62, 5)[1:],
        history=[p1, p2],
        resume=crud_events(True, 62, 5)[0]["_id"],
        source=resumed,
    )
    cases += both(
        "txn-applyOps-resumed-after-its-second-op",
        [txn_entry(crud, 50)],
        lambda x: crud_events(x, 50, 5)[2:],
        resume=crud_events(True, 50, 5)[1]["_id"],
        source=resumed,
    )
    other = [
        entry(
            "c",
            ADMIN_CMD,
            {
                "applyOps": [inner("i", ORDERS, {"_id": OID[5]}, o2={"_id": OID[5]})],
                "partialTxn": True,
            },
            63,
            txn=9,
            prev=NULL_OPTIME,
        )
    ]
    q1 = txn_entry(crud[:2], 64, partialTxn=True)
    plain = entry("i", ORDERS, {"_id": OID[6]}, 65, ui=UI, o2={"_id": OID[6]})
    q2 = txn_entry(crud[2:], 66, prev=optime(64), count=Int64(3))
    other_end = entry(
        "c",
        ADMIN_CMD,
        {"applyOps": [inner("d", ORDERS, {"_id": OID[5]})], "count": Int64(2)},
        67,
        txn=9,
        prev=optime(63),
    )
    cases += both(
        "partialTxn-chains-interleaved",
        [other[0], q1, plain, q2, other_end],
        lambda x: [
            event(
                "insert", 65, "orders", ui=UI, expanded=x, full={"_id": OID[6]}, key={"_id": OID[6]}
            ),
            *crud_events(x, 66, 5),
            event(
                "insert",
                67,
                "orders",
                ui=UI,
                expanded=x,
                txn_index=0,
                txn=9,
                full={"_id": OID[5]},
                key={"_id": OID[5]},
            ),
            event(
                "delete", 67, "orders", ui=UI, expanded=x, txn_index=1, txn=9, key={"_id": OID[5]}
            ),
        ],
    )

    # Prepared transactions (every transaction that spans shards).
    prep = txn_entry(crud, 70, prepare=True)
    commit = entry(
        "c",
        ADMIN_CMD,
        {"commitTransaction": 1, "commitTimestamp": ts(71)},
        72,
        txn=5,
        prev=optime(70),
    )
    cases += both("prepare-then-commitTransaction", [prep, commit], lambda x: crud_events(x, 72, 5))
    cases += both(
        "prepare-then-abortTransaction",
        [prep, entry("c", ADMIN_CMD, {"abortTransaction": 1}, 72, txn=5, prev=optime(70))],
        lambda x: [],
    )
    cases += both(
        "commitTransaction-after-the-read-began",
        [commit],
        lambda x: crud_events(x, 72, 5),
        history=[prep],
    )
    cases += both(
        "abortTransaction-after-the-read-began",
        [entry("c", ADMIN_CMD, {"abortTransaction": 1}, 72, txn=5, prev=optime(70))],
        lambda x: [],
        history=[prep],
    )
    internal = {**LSID, "txnNumber": Int64(12), "txnUUID": uuid_of(41)}
    cases += both(
        "txn-internal-session-for-a-retryable-write",
        [txn_entry(crud[:1], 77, txn=0, lsid=internal)],
        lambda x: [
            event(
                "insert",
                77,
                "orders",
                ui=UI,
                expanded=x,
                txn_index=0,
                txn=0,
                full=crud[0]["o"],
                key=k0,
                lsid=internal,
            )
        ],
        source="6.0+ runs some retryable writes on a sharded cluster (a shard key change, a write "
        "without shard key) as an internal transaction: its lsid is the parent's {id, uid} plus "
        "txnNumber (the parent's) and txnUUID (logical_session_id.idl InternalSessionFields), its "
        "txnNumber the internal transaction's; the unwound events carry that lsid as written "
        "(TransactionOpIterator::_addRequiredTransactionFields)",
    )
    big1 = txn_entry(crud[:2], 73, partialTxn=True)
    big2 = txn_entry(crud[2:], 74, prev=optime(73), prepare=True, count=Int64(3))
    big_commit = entry(
        "c",
        ADMIN_CMD,
        {"commitTransaction": 1, "commitTimestamp": ts(75)},
        76,
        txn=5,
        prev=optime(74),
    )
    cases += both(
        "partialTxn-prepare-commit", [big1, big2, big_commit], lambda x: crud_events(x, 76, 5)
    )
    cases += both(
        "prepare-with-other-writes-before-commit",
        [prep, entry("i", ORDERS, {"_id": OID[7]}, 71, ui=UI, o2={"_id": OID[7]}), commit],
        lambda x: [
            event(
                "insert", 71, "orders", ui=UI, expanded=x, full={"_id": OID[7]}, key={"_id": OID[7]}
            ),
            *crud_events(x, 72, 5),
        ],
    )
    return {"kind": "transaction", "sources": TXN_SOURCES, "cases": cases}


COLLATION_FR = {
    "locale": "fr",
    "caseLevel": False,
    "caseFirst": "off",
    "strength": 3,
    "numericOrdering": False,
    "alternate": "non-ignorable",
    "maxVariable": "punct",
    "normalization": False,
    "backwards": False,
    "version": "57.1",
}


def creates() -> dict[str, Any]:
    cases = []
    options: dict[str, dict[str, Any]] = {
        "basic": {"idIndex": ID_INDEX},
        "capped": {"capped": True, "size": 4096, "max": 100, "idIndex": ID_INDEX},
        "pre-and-post-images": {
            "changeStreamPreAndPostImages": {"enabled": True},
            "idIndex": ID_INDEX,
        },
        "storage-engine": {
            "storageEngine": {"wiredTiger": {"configString": "block_compressor=zstd"}},
            "indexOptionDefaults": {"storageEngine": {"wiredTiger": {}}},
            "idIndex": ID_INDEX,
        },
        "validator": {
            "validator": {"$jsonSchema": {"bsonType": "object", "required": ["sku"]}},
            "validationLevel": "moderate",
            "validationAction": "warn",
            "idIndex": ID_INDEX,
        },
        "collation": {
            "collation": COLLATION_FR,
            "idIndex": {**ID_INDEX, "collation": COLLATION_FR},
        },
        "clustered-ttl": {
            "clusteredIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_", "unique": True},
            "expireAfterSeconds": Int64(3600),
        },
        # $out's temporary collection (document_source_out.cpp creates it with temp: true).
        "temp": {"temp": True, "idIndex": ID_INDEX},
        # Queryable Encryption: encryptedFields comes after idIndex in appendBSON's order.
        "encrypted-fields": {
            "idIndex": ID_INDEX,
            "encryptedFields": {
                "escCollection": "enxcol_.fresh.esc",
                "ecocCollection": "enxcol_.fresh.ecoc",
                "fields": [
                    {
                        "keyId": uuid_of(40),
                        "path": "ssn",
                        "bsonType": "string",
                        "queries": {"queryType": "equality", "contention": Int64(8)},
                    }
                ],
            },
        },
    }
    for name, opts in options.items():
        e = entry("c", CMD, {"create": "fresh", **opts}, 80, ui=NEW_UI)
        cases += both(
            f"create-{name}",
            [e],
            lambda x, o=opts: (
                [event("create", 80, "fresh", ui=NEW_UI, expanded=x, desc=o)] if x else []
            ),
        )
    cases += both(
        "create-system-views",
        [entry("c", CMD, {"create": "system.views", "idIndex": ID_INDEX}, 81, ui=VIEWS_UI)],
        lambda x: [],
        source="the first view of a database creates system.views (ViewsForDatabase)",
    )
    cases += both(
        "create-admin-db-no-event",
        [entry("c", "admin.$cmd", {"create": "things", "idIndex": ID_INDEX}, 82, ui=uuid_of(23))],
        lambda x: [],
    )
    cases += both(
        "create-fromMigrate-no-event",
        [
            entry(
                "c", CMD, {"create": "fresh", "idIndex": ID_INDEX}, 83, ui=NEW_UI, from_migrate=True
            )
        ],
        lambda x: [],
        source="a migration's recipient creates the collection with fromMigrate: true "
        "(migration_destination_manager.cpp cloneCollectionIndexesAndOptions); shown only with "
        "showSystemEvents (buildFromMigrateSystemOpFilter), which the engine does not take",
    )
    return {
        "kind": "create",
        "cases": cases,
        "sources": [
            "op_observer_impl.cpp OpObserverImpl::onCreateCollection -> "
            "MutableOplogEntry::makeCreateCommand: "
            "{create: <coll>, <CollectionOptions::toBSON without uuid>}; collection_options.cpp "
            "CollectionOptions::appendBSON order: capped, size (appendNumber: Int32 when it fits), "
            "max, autoIndexId, "
            "temp, recordPreImages, changeStreamPreAndPostImages, storageEngine, "
            "indexOptionDefaults, validator, "
            "validationLevel, validationAction, collation, clusteredIndex, expireAfterSeconds "
            "(Int64), viewOn, "
            "pipeline, idIndex, timeseries, encryptedFields",
            "change_stream_event_transform.cpp case kCommand, o.create: operationDescription = o "
            "minus create; "
            "the filter matches o.create against collRegex (no system.*)",
            "jstests/change_streams/ddl_create_event.js: clustered collections have no idIndex, "
            "expireAfterSeconds is NumberLong, a collation is expanded to its full spec and also "
            "in idIndex",
        ],
    }


SPEC_SKU = {"v": 2, "key": {"sku": 1}, "name": "sku_1"}
SPEC_EMAIL = {
    "v": 2,
    "unique": True,
    "key": {"email": 1},
    "name": "email_1",
    "partialFilterExpression": {"email": {"$exists": True}},
}


def indexes() -> dict[str, Any]:
    cases = []
    for name, spec in (("single", SPEC_SKU), ("unique-partial", SPEC_EMAIL)):
        e = entry("c", CMD, {"createIndexes": "orders", **spec}, 90, ui=UI)
        cases += both(
            f"createIndexes-{name}",
            [e],
            lambda x, s=spec: (
                [event("createIndexes", 90, "orders", ui=UI, expanded=x, desc={"indexes": [s]})]
                if x
                else []
            ),
        )
    start = entry(
        "c",
        CMD,
        {
            "startIndexBuild": "orders",
            "indexBuildUUID": BUILD_UUID,
            "indexes": [SPEC_SKU, SPEC_EMAIL],
        },
        91,
        ui=UI,
    )
    commit = entry(
        "c",
        CMD,
        {
            "commitIndexBuild": "orders",
            "indexBuildUUID": BUILD_UUID,
            "indexes": [SPEC_SKU, SPEC_EMAIL],
        },
        92,
        ui=UI,
    )
    abort = entry(
        "c",
        CMD,
        {
            "abortIndexBuild": "orders",
            "indexBuildUUID": BUILD_UUID,
            "indexes": [SPEC_SKU, SPEC_EMAIL],
            "cause": {
                "ok": 0.0,
                "errmsg": "E11000 duplicate key error",
                "code": 11000,
                "codeName": "DuplicateKey",
            },
        },
        92,
        ui=UI,
    )
    cases += both("startIndexBuild-no-event", [start], lambda x: [])
    cases += both(
        "startIndexBuild-commitIndexBuild",
        [start, commit],
        lambda x: (
            [
                event(
                    "createIndexes",
                    92,
                    "orders",
                    ui=UI,
                    expanded=x,
                    desc={"indexes": [SPEC_SKU, SPEC_EMAIL]},
                )
            ]
            if x
            else []
        ),
    )
    cases += both("startIndexBuild-abortIndexBuild-no-event", [start, abort], lambda x: [])
    drop = entry("c", CMD, {"dropIndexes": "orders", "index": "sku_1"}, 93, ui=UI, o2=SPEC_SKU)
    cases += both(
        "dropIndexes",
        [drop],
        lambda x: (
            [event("dropIndexes", 93, "orders", ui=UI, expanded=x, desc={"indexes": [SPEC_SKU]})]
            if x
            else []
        ),
    )
    cases += both(
        "createIndexes-fromMigrate-no-event",
        [entry("c", CMD, {"createIndexes": "orders", **SPEC_SKU}, 94, ui=UI, from_migrate=True)],
        lambda x: [],
    )
    cases += both(
        "createIndexes-config-db-no-event",
        [entry("c", "config.$cmd", {"createIndexes": "chunks", **SPEC_SKU}, 95, ui=uuid_of(24))],
        lambda x: [],
    )
    return {
        "kind": "index",
        "cases": cases,
        "sources": [
            "op_observer_impl.cpp OpObserverImpl::onCreateIndex: {createIndexes: <coll>, <the "
            "spec>} for an "
            "index built on an empty collection; onStartIndexBuild / onCommitIndexBuild / "
            "onAbortIndexBuild "
            "(index_builds_coordinator.cpp, two-phase builds): "
            "{startIndexBuild|commitIndexBuild|abortIndexBuild: "
            "<coll>, indexBuildUUID, indexes: [specs][, cause]}; onDropIndex: o {dropIndexes, "
            "index: <name>}, "
            "o2 = the dropped spec",
            "index_catalog_impl.cpp IndexCatalogImpl::_fixIndexSpec: spec order v, unique, key, "
            "name, <rest>",
            "change_stream_event_transform.cpp: createIndexes -> {indexes: [o minus "
            "createIndexes]}; "
            "commitIndexBuild -> {indexes: o.indexes}; dropIndexes -> {indexes: [o2 minus "
            "dropIndexes]}; "
            "startIndexBuild and abortIndexBuild are not matched by buildOperationFilter",
            "jstests/change_streams/ddl_create_drop_index_events.js",
        ],
    }


def coll_mods() -> dict[str, Any]:
    cases = []
    for name, o, o2, before in (
        (
            "validator",
            {"validator": {"qty": {"$gte": 0}}, "validationLevel": "moderate"},
            {"collectionOptions_old": {"uuid": UI, "validator": {"qty": {"$gte": 1}}}},
            {"collectionOptions": {"uuid": UI, "validator": {"qty": {"$gte": 1}}}},
        ),
        (
            "hide-index",
            {"index": {"name": "sku_1", "hidden": True}},
            {"collectionOptions_old": {"uuid": UI}, "indexOptions_old": {"hidden": False}},
            {"collectionOptions": {"uuid": UI}, "indexOptions": {"hidden": False}},
        ),
        (
            "ttl-index",
            {"index": {"name": "at_1", "expireAfterSeconds": Int64(60)}},
            {
                "collectionOptions_old": {"uuid": UI},
                "indexOptions_old": {"expireAfterSeconds": Int64(3600)},
            },
            {
                "collectionOptions": {"uuid": UI},
                "indexOptions": {"expireAfterSeconds": Int64(3600)},
            },
        ),
        (
            "pre-and-post-images",
            {"changeStreamPreAndPostImages": {"enabled": True}},
            {"collectionOptions_old": {"uuid": UI}},
            {"collectionOptions": {"uuid": UI}},
        ),
    ):
        e = entry("c", CMD, {"collMod": "orders", **o}, 100, ui=UI, o2=o2)
        cases += both(
            f"collMod-{name}",
            [e],
            lambda x, d=o, b=before: (
                [event("modify", 100, "orders", ui=UI, expanded=x, desc=d, before=b)] if x else []
            ),
        )
    return {
        "kind": "collMod",
        "cases": cases,
        "sources": [
            "op_observer_impl.cpp OpObserverImpl::onCollMod: o = the collMod command as applied "
            "(an index change "
            "as {name, <changed options>}), o2 = {collectionOptions_old: <CollectionOptions with "
            "uuid first>, "
            "indexOptions_old?: {<the index's previous values>}}",
            "change_stream_event_transform.cpp o.collMod: modify, operationDescription = o minus "
            "collMod, "
            "stateBeforeChange = {collectionOptions: o2.collectionOptions_old, indexOptions: "
            "o2.indexOptions_old}",
            "jstests/change_streams/ddl_coll_mod_event.js (stateBeforeChange.collectionOptions has "
            "uuid); the index-hiding shape matches a 2025 server's entry quoted in public "
            "oplog-tooling code (fidelity audit M19)",
        ],
    }


VIEW_PIPELINE = [{"$match": {"status": "paid"}}]


def views() -> dict[str, Any]:
    cases = []
    vns = ns("system.views")
    create = entry(
        "i",
        vns,
        {"_id": "shop.paid", "viewOn": "orders", "pipeline": VIEW_PIPELINE},
        110,
        ui=VIEWS_UI,
        o2={"_id": "shop.paid"},
    )
    cases += both(
        "view-create",
        [create],
        lambda x: (
            [
                event(
                    "create",
                    110,
                    "paid",
                    ui=VIEWS_UI,
                    expanded=x,
                    view=True,
                    desc={"viewOn": "orders", "pipeline": VIEW_PIPELINE},
                )
            ]
            if x
            else []
        ),
    )
    with_collation = {
        "_id": "shop.paidFr",
        "viewOn": "orders",
        "pipeline": VIEW_PIPELINE,
        "collation": COLLATION_FR,
    }
    cases += both(
        "view-create-with-collation",
        [entry("i", vns, with_collation, 111, ui=VIEWS_UI, o2={"_id": "shop.paidFr"})],
        lambda x: (
            [
                event(
                    "create",
                    111,
                    "paidFr",
                    ui=VIEWS_UI,
                    expanded=x,
                    view=True,
                    desc={"viewOn": "orders", "pipeline": VIEW_PIPELINE, "collation": COLLATION_FR},
                )
            ]
            if x
            else []
        ),
    )
    new_pipeline = [{"$match": {"status": "shipped"}}]
    cases += both(
        "view-modify",
        [
            entry(
                "u",
                vns,
                {"_id": "shop.paid", "viewOn": "orders", "pipeline": new_pipeline},
                112,
                ui=VIEWS_UI,
                o2={"_id": "shop.paid"},
            )
        ],
        lambda x: (
            [
                event(
                    "modify",
                    112,
                    "paid",
                    ui=VIEWS_UI,
                    expanded=x,
                    view=True,
                    desc={"viewOn": "orders", "pipeline": new_pipeline},
                )
            ]
            if x
            else []
        ),
        source="a collMod of a view is logged as a replacement update of system.views (tassert "
        "6188601 "
        "'Expected replacement update'); jstests/change_streams/ddl_view_events.js 'collMod' on "
        "views",
    )
    cases += both(
        "view-drop",
        [entry("d", vns, {"_id": "shop.paid"}, 113, ui=VIEWS_UI)],
        lambda x: [event("drop", 113, "paid", ui=VIEWS_UI, expanded=x, view=True)] if x else [],
    )
    return {
        "kind": "system.views",
        "cases": cases,
        "sources": [
            "src/mongo/db/views/durable_view_catalog.cpp: a view is a document {_id: "
            "'<db>.<view>', viewOn, "
            "pipeline[, collation]} of <db>.system.views, inserted, replaced (collMod) and deleted",
            "change_stream_event_transform.cpp "
            "ChangeStreamViewDefinitionEventTransformation::applyTransformation: "
            "insert -> create, update -> modify, delete -> drop; ns from o._id; "
            "operationDescription = o minus "
            "_id; no collectionUUID; the token's UUID is the entry's ui (system.views')",
            "change_stream_filter_helpers.cpp buildViewDefinitionEventFilter, added by "
            "document_source_change_stream_oplog_match.cpp buildOplogMatchFilter only with "
            "showExpandedEvents on a whole-db or whole-cluster stream; "
            "ChangeStreamEventTransformer::getBuilder (not on single-collection streams)",
            "jstests/change_streams/ddl_view_events.js",
        ],
    }


def timeseries() -> dict[str, Any]:
    cases = []
    buckets = "system.buckets.weather"
    spec = {"timeField": "time", "granularity": "seconds", "bucketMaxSpanSeconds": 3600}
    validator = {"$jsonSchema": {"bsonType": "object", "required": ["_id", "control", "data"]}}
    cases += both(
        "timeseries-buckets-create",
        [
            entry(
                "c",
                CMD,
                {
                    "create": buckets,
                    "validator": validator,
                    "clusteredIndex": True,
                    "timeseries": spec,
                },
                120,
                ui=BUCKETS_UI,
            )
        ],
        lambda x: [],
        source="jstests/change_streams/ddl_create_event.js: 'the time-series create command does "
        "not produce "
        "an event'",
    )
    unpack = [{"$_internalUnpackBucket": {"timeField": "time", "bucketMaxSpanSeconds": 3600}}]
    view_doc = {"_id": "shop.weather", "viewOn": buckets, "pipeline": unpack}
    cases += both(
        "timeseries-view-create",
        [entry("i", ns("system.views"), view_doc, 121, ui=VIEWS_UI, o2={"_id": "shop.weather"})],
        lambda x: (
            [
                event(
                    "create",
                    121,
                    "weather",
                    ui=VIEWS_UI,
                    expanded=x,
                    view=True,
                    desc={"viewOn": buckets, "pipeline": unpack},
                )
            ]
            if x
            else []
        ),
        source="jstests/change_streams/ddl_view_events.js timeseries section: one create event "
        "from "
        "system.views with viewOn system.buckets.<name> and the $_internalUnpackBucket pipeline",
    )
    bucket_doc = {
        "_id": OID[8],
        "control": {"version": 1, "min": {"time": wall(0)}, "max": {"time": wall(0)}},
        "data": {"time": {"0": wall(0)}},
    }
    cases += both(
        "timeseries-bucket-writes-no-event",
        [
            entry("i", ns(buckets), bucket_doc, 122, ui=BUCKETS_UI, o2={"_id": OID[8]}),
            entry(
                "u",
                ns(buckets),
                {"$v": 2, "diff": {"sdata": {"stime": {"i": {"1": wall(1)}}}}},
                123,
                ui=BUCKETS_UI,
                o2={"_id": OID[8]},
            ),
            entry("d", ns(buckets), {"_id": OID[8]}, 124, ui=BUCKETS_UI),
        ],
        lambda x: [],
    )
    cases += both(
        "timeseries-buckets-createIndexes",
        [
            entry(
                "c",
                CMD,
                {
                    "createIndexes": buckets,
                    "v": 2,
                    "key": {"control.min.time": 1},
                    "name": "time_1",
                },
                125,
                ui=BUCKETS_UI,
            )
        ],
        lambda x: [],
    )
    cases += both(
        "timeseries-buckets-collMod",
        [
            entry(
                "c",
                CMD,
                {"collMod": buckets, "expireAfterSeconds": Int64(86400)},
                126,
                ui=BUCKETS_UI,
                o2={"collectionOptions_old": {"uuid": BUCKETS_UI}},
            )
        ],
        lambda x: [],
    )
    cases += both(
        "timeseries-buckets-drop",
        [entry("c", CMD, {"drop": buckets}, 127, ui=BUCKETS_UI, o2={"numRecords": Int64(1)})],
        lambda x: [],
    )
    new_unpack = [{"$_internalUnpackBucket": {"timeField": "time", "bucketMaxSpanSeconds": 86400}}]
    cases += both(
        "timeseries-granularity-collMod",
        [
            entry(
                "c",
                CMD,
                {"collMod": buckets, "timeseries": {"granularity": "hours"}},
                129,
                ui=BUCKETS_UI,
                o2={"collectionOptions_old": {"uuid": BUCKETS_UI, "timeseries": spec}},
            ),
            entry(
                "u",
                ns("system.views"),
                {"_id": "shop.weather", "viewOn": buckets, "pipeline": new_unpack},
                130,
                ui=VIEWS_UI,
                o2={"_id": "shop.weather"},
            ),
        ],
        lambda x: (
            [
                event(
                    "modify",
                    130,
                    "weather",
                    ui=VIEWS_UI,
                    expanded=x,
                    view=True,
                    desc={"viewOn": buckets, "pipeline": new_unpack},
                )
            ]
            if x
            else []
        ),
        source="collMod of a time-series collection's granularity (src/mongo/db/catalog/"
        "coll_mod.cpp) changes the buckets collection's options and replaces the view definition, "
        "whose pipeline carries bucketMaxSpanSeconds (a replacement update of system.views, "
        "tassert 6188601): one `modify` from system.views",
    )
    cases += both(
        "timeseries-view-drop",
        [entry("d", ns("system.views"), {"_id": "shop.weather"}, 128, ui=VIEWS_UI)],
        lambda x: [event("drop", 128, "weather", ui=VIEWS_UI, expanded=x, view=True)] if x else [],
    )
    return {
        "kind": "timeseries",
        "cases": cases,
        "sources": [
            "src/mongo/db/timeseries/timeseries_collection_creation_helpers / "
            "create_collection.cpp "
            "(_createTimeseries): a time-series collection (7.0/8.0) is a clustered "
            "system.buckets.<name> "
            "collection (create with clusteredIndex: true and timeseries) plus a view <name> on it "
            "in "
            "system.views; its writes go to system.buckets.<name>",
            "change_stream_filter_helpers.cpp: nsRegex / collRegex exclude system.* "
            "(kRegexAllCollections, "
            "document_source_change_stream.h)",
            "jstests/change_streams/ddl_view_events.js",
        ],
    }


def noops() -> dict[str, Any]:
    cases = []
    shard = {
        "shardKey": {"region": 1, "_id": 1},
        "unique": False,
        "numInitialChunks": Int64(0),
        "presplitHashedZones": False,
    }
    cases += both(
        "shardCollection",
        [
            entry(
                "n",
                ORDERS,
                {"msg": {"shardCollection": ORDERS}},
                130,
                ui=UI,
                o2={"shardCollection": ORDERS, **shard},
            )
        ],
        lambda x: (
            [event("shardCollection", 130, "orders", ui=UI, expanded=x, desc=shard)] if x else []
        ),
    )
    with_collation = {
        "shardKey": {"sku": "hashed"},
        "unique": False,
        "numInitialChunks": Int64(10),
        "presplitHashedZones": False,
        "collation": {"locale": "simple"},
    }
    cases += both(
        "shardCollection-with-collation",
        [
            entry(
                "n",
                ORDERS,
                {"msg": {"shardCollection": ORDERS}},
                131,
                ui=UI,
                o2={"shardCollection": ORDERS, **with_collation},
            )
        ],
        lambda x: (
            [event("shardCollection", 131, "orders", ui=UI, expanded=x, desc=with_collation)]
            if x
            else []
        ),
        source="the shardCollection-events jstest the fidelity audit cites for D14b: "
        "numInitialChunks NumberLong(10) and collation {locale: 'simple'} when given",
    )
    reshard = {
        "reshardUUID": NEW_UI,
        "shardKey": {"customer": 1},
        "oldShardKey": {"region": 1, "_id": 1},
        "unique": False,
        "numInitialChunks": Int64(1),
    }
    cases += both(
        "reshardCollection",
        [
            entry(
                "n",
                ORDERS,
                {"msg": "Reshard collection shop.orders with shard key { customer: 1 }"},
                132,
                ui=UI,
                o2={"reshardCollection": ORDERS, **reshard},
            )
        ],
        lambda x: (
            [event("reshardCollection", 132, "orders", ui=UI, expanded=x, desc=reshard)]
            if x
            else []
        ),
        source="reshard_collection_coordinator.cpp notifyChangeStreamsOnReshardCollectionComplete "
        "(7.0; 8.0: change_stream_oplog_notification.cpp, from a CollectionResharded "
        "notification): "
        "ns and ui the collection's before resharding, o {msg: 'Reshard collection <nss> with "
        "shard "
        "key <key>'}, o2 {reshardCollection: nss, reshardUUID: the new collection's UUID, "
        "shardKey, "
        "oldShardKey, unique, numInitialChunks?, collation?, zones?}",
    )
    refine = {"shardKey": {"region": 1, "_id": 1, "day": 1}, "oldShardKey": {"region": 1, "_id": 1}}
    cases += both(
        "refineCollectionShardKey",
        [
            entry(
                "n",
                ORDERS,
                {
                    "msg": "Refine shard key for collection shop.orders with { region: 1, _id: 1, "
                    "day: 1 }"
                },
                133,
                ui=UI,
                o2={"refineCollectionShardKey": ORDERS, **refine},
            )
        ],
        lambda x: (
            [event("refineCollectionShardKey", 133, "orders", ui=UI, expanded=x, desc=refine)]
            if x
            else []
        ),
        source="refine_collection_shard_key_coordinator.cpp "
        "notifyChangeStreamsOnRefineCollectionShardKeyComplete (onInternalOpMessage): ns and ui "
        "the "
        "collection's, o {msg: 'Refine shard key for collection <nss> with <key>'}, o2 "
        "{refineCollectionShardKey: nss, shardKey, oldShardKey}",
    )
    silent = (
        (
            "migrateLastChunkFromShard",
            ORDERS,
            {"msg": "Migrate the last chunk for shop.orders off shard shard0"},
            {"migrateLastChunkFromShard": ORDERS, "shardId": "shard0"},
            UI,
        ),
        (
            "migrateChunkToNewShard",
            ORDERS,
            {
                "msg": "Migrating chunk from shard shard0 to shard shard1 with no chunks for this "
                "collection"
            },
            {"migrateChunkToNewShard": ORDERS, "fromShardId": "shard0", "toShardId": "shard1"},
            UI,
        ),
        (
            "movePrimary",
            DB,
            {"msg": {"movePrimary": DB}},
            {"movePrimary": DB, "from": "shard0", "to": "shard1"},
            None,
        ),
        (
            "enableSharding",
            DB,
            {"msg": {"enableSharding": DB}},
            {"enableSharding": DB, "primaryShard": "shard0", "isImported": False},
            None,
        ),
        ("periodic-noop", "", {"msg": "periodic noop"}, None, None),
        ("new-primary", "", {"msg": "new primary"}, None, None),
        ("appendOplogNote", "", {"backup": "checkpoint-17"}, None, None),
    )
    for name, nsx, o, o2, ui in silent:
        cases += both(f"{name}-no-event", [entry("n", nsx, o, 134, ui=ui, o2=o2)], lambda x: [])
    sessions = "config.system.sessions"
    cases += both(
        "shardCollection-config-system-sessions-no-event",
        [
            entry(
                "n",
                sessions,
                {"msg": {"shardCollection": sessions}},
                135,
                ui=uuid_of(21),
                o2={
                    "shardCollection": sessions,
                    "shardKey": {"_id": 1},
                    "unique": False,
                    "numInitialChunks": Int64(0),
                    "presplitHashedZones": False,
                },
            )
        ],
        lambda x: [],
        source="every sharded cluster shards config.system.sessions "
        "(sessions_collection_config_server.cpp "
        "_shardCollectionIfNeeded), through the same coordinator and noop as a user collection",
    )
    last = {"shardId": "shard0"}
    cases.append(
        case(
            "migrateLastChunkFromShard-showSystemEvents",
            [
                entry(
                    "n",
                    ORDERS,
                    {"msg": "Migrate the last chunk for shop.orders off shard shard0"},
                    136,
                    ui=UI,
                    o2={"migrateLastChunkFromShard": ORDERS, **last},
                )
            ],
            [event("migrateLastChunkFromShard", 136, "orders", ui=UI, expanded=True, desc=last)],
            options=SYSTEM,
            source="migration_util.cpp notifyChangeStreamsOnDonorLastChunk (7.0; 8.0: "
            "change_stream_oplog_notification.cpp buildMoveChunkOplogEntries): the donor writes "
            "{msg: 'Migrate the last chunk for <nss> off shard <donor>'}, o2 "
            "{migrateLastChunkFromShard: nss, shardId: donor} when a migration takes its last "
            "chunk "
            "of the collection; buildInternalOpFilter matches it only with showSystemEvents",
        )
    )
    return {
        "kind": "noop",
        "cases": cases,
        "sources": [
            "src/mongo/db/repl/change_stream_oplog_notification.cpp "
            "notifyChangeStreamsOnShardCollection: "
            "{op: 'n', ns: nss, ui: uuid, o: {msg: {shardCollection: nss}}, o2: {shardCollection: "
            "nss, "
            "<the coordinator's request: shardKey, unique, numInitialChunks, presplitHashedZones[, "
            "collation]>}}; "
            "notifyChangeStreamsOnMovePrimary, notifyChangeStreamsOnDatabaseAdded (enableSharding)",
            "change_stream_filter_helpers.cpp buildInternalOpFilter: noops with "
            "o2.shardCollection, "
            "reshardBegin, reshardDoneCatchUp, refineCollectionShardKey, reshardCollection; "
            "migrateChunkToNewShard "
            "only inMongos/needsMerge (consumed by mongos, never shown); migrateLastChunkFromShard "
            "only with "
            "showSystemEvents",
            "change_stream_event_transform.cpp case kNoop: operationDescription = o2 minus its "
            "type key; "
            "ns and ui from the entry",
            "noop_writer.cpp (periodic noop); oplog_note.cpp appendOplogNote: {op: 'n', ns: '', "
            "o: <data>}",
        ],
    }


def from_migrate() -> dict[str, Any]:
    cases = []
    k = {"_id": OID[0]}
    writes = (
        (
            "insert",
            entry("i", ORDERS, {"_id": OID[0], "qty": 1}, 140, ui=UI, o2=k, from_migrate=True),
        ),
        (
            "update",
            entry(
                "u",
                ORDERS,
                {"$v": 2, "diff": {"u": {"qty": 2}}},
                140,
                ui=UI,
                o2=k,
                from_migrate=True,
            ),
        ),
        (
            "replace",
            entry("u", ORDERS, {"_id": OID[0], "qty": 3}, 140, ui=UI, o2=k, from_migrate=True),
        ),
        ("delete", entry("d", ORDERS, k, 140, ui=UI, from_migrate=True)),
        (
            "create",
            entry(
                "c", CMD, {"create": "orders", "idIndex": ID_INDEX}, 140, ui=UI, from_migrate=True
            ),
        ),
        (
            "createIndexes",
            entry("c", CMD, {"createIndexes": "orders", **SPEC_SKU}, 140, ui=UI, from_migrate=True),
        ),
        (
            "commitIndexBuild",
            entry(
                "c",
                CMD,
                {"commitIndexBuild": "orders", "indexBuildUUID": BUILD_UUID, "indexes": [SPEC_SKU]},
                140,
                ui=UI,
                from_migrate=True,
            ),
        ),
        (
            "dropIndexes",
            entry(
                "c",
                CMD,
                {"dropIndexes": "orders", "index": "sku_1"},
                140,
                ui=UI,
                o2=SPEC_SKU,
                from_migrate=True,
            ),
        ),
        (
            "collMod",
            entry(
                "c",
                CMD,
                {"collMod": "orders", "validationLevel": "off"},
                140,
                ui=UI,
                o2={"collectionOptions_old": {"uuid": UI}},
                from_migrate=True,
            ),
        ),
        (
            "drop",
            entry(
                "c",
                CMD,
                {"drop": "orders"},
                140,
                ui=UI,
                o2={"numRecords": Int64(0)},
                from_migrate=True,
            ),
        ),
        (
            "renameCollection",
            entry(
                "c",
                CMD,
                {"renameCollection": ORDERS, "to": ns("archive"), "stayTemp": False},
                140,
                ui=UI,
                o2={"numRecords": Int64(0)},
                from_migrate=True,
            ),
        ),
        ("dropDatabase", entry("c", CMD, {"dropDatabase": 1}, 140, from_migrate=True)),
        (
            "view-insert",
            entry(
                "i",
                ns("system.views"),
                {"_id": "shop.v", "viewOn": "orders", "pipeline": []},
                140,
                ui=VIEWS_UI,
                o2={"_id": "shop.v"},
                from_migrate=True,
            ),
        ),
    )
    for name, e in writes:
        cases += both(f"fromMigrate-{name}-no-event", [e], lambda x: [])
    create, create_indexes = writes[4][1], writes[5][1]
    cases.append(
        case(
            "fromMigrate-create-showSystemEvents",
            [create],
            [event("create", 140, "orders", ui=UI, expanded=True, desc={"idIndex": ID_INDEX})],
            options=SYSTEM,
        )
    )
    cases.append(
        case(
            "fromMigrate-createIndexes-showSystemEvents",
            [create_indexes],
            [
                event(
                    "createIndexes",
                    140,
                    "orders",
                    ui=UI,
                    expanded=True,
                    desc={"indexes": [SPEC_SKU]},
                )
            ],
            options=SYSTEM,
        )
    )
    cases.append(
        case("fromMigrate-insert-showSystemEvents-no-event", [writes[0][1]], [], options=SYSTEM)
    )
    return {
        "kind": "fromMigrate",
        "cases": cases,
        "sources": [
            "oplog_entry.idl fromMigrate: 'Marks the operation as an internal event that should be "
            "hidden to the "
            "end user'; set by chunk migrations (both sides), the range deleter, resharding, "
            "movePrimary and the "
            "sharding DDL coordinators on non-primary shards (drop_collection_coordinator.cpp "
            "sendDropCollectionParticipantCommandToShards(..., fromMigrate); "
            "drop_database_coordinator.cpp)",
            "change_stream_filter_helpers.cpp buildNotFromMigrateFilter: {fromMigrate: {$ne: "
            "true}} on every "
            "entry the stream reads (the view filter included); only showSystemEvents lets "
            "fromMigrate "
            "create/createIndexes through",
        ],
    }


def ddl() -> dict[str, Any]:
    cases = []
    tmp, tmp_ui, old_ui = "tmp.agg_out.4f2a", uuid_of(30), uuid_of(31)
    report = {"db": DB, "coll": "report"}
    out_entries = [
        entry("c", CMD, {"create": tmp, "temp": True, "idIndex": ID_INDEX}, 160, ui=tmp_ui),
        *(entry("i", ns(tmp), {"_id": i}, 161 + i, ui=tmp_ui, o2={"_id": i}) for i in range(2)),
        entry(
            "c",
            CMD,
            {
                "renameCollection": ns(tmp),
                "to": ns("report"),
                "stayTemp": False,
                "dropTarget": old_ui,
            },
            163,
            ui=tmp_ui,
            o2={"numRecords": Int64(2)},
        ),
    ]
    cases += both(
        "aggregate-$out-temporary-collection-then-rename",
        out_entries,
        lambda x: [
            *(
                [
                    event(
                        "create",
                        160,
                        tmp,
                        ui=tmp_ui,
                        expanded=x,
                        desc={"temp": True, "idIndex": ID_INDEX},
                    )
                ]
                if x
                else []
            ),
            *(
                event(
                    "insert", 161 + i, tmp, ui=tmp_ui, expanded=x, full={"_id": i}, key={"_id": i}
                )
                for i in range(2)
            ),
            event(
                "rename",
                163,
                tmp,
                ui=tmp_ui,
                expanded=x,
                to=report,
                desc={"to": report, "dropTarget": old_ui},
            ),
        ],
        source="src/mongo/db/pipeline/document_source_out.cpp: $out writes into a temporary "
        "collection tmp.agg_out.<id> created with temp: true, then renames it over the target with "
        "dropTarget (the old target's UUID)",
    )
    cases += both(
        "dbCheck-no-event",
        [
            entry(
                "c",
                CMD,
                {
                    "dbCheck": "orders",
                    "type": "batch",
                    "md5": "d41d8cd98f00b204e9800998ecf8427e",
                    "minKey": {"_id": OID[0]},
                    "maxKey": {"_id": OID[9]},
                },
                164,
                ui=UI,
            )
        ],
        lambda x: [],
        source="src/mongo/db/commands/dbcheck.cpp logs its batches as {dbCheck: <coll>, type, ...} "
        "commands (oplog_entry.idl CommandType kDbCheck), which no change stream filter matches",
    )
    cases += both(
        "drop",
        [entry("c", CMD, {"drop": "orders"}, 150, ui=UI, o2={"numRecords": Int64(12)})],
        lambda x: [event("drop", 150, "orders", ui=UI, expanded=x)],
    )
    to = {"db": DB, "coll": "archive"}
    cases += both(
        "renameCollection",
        [
            entry(
                "c",
                CMD,
                {"renameCollection": ORDERS, "to": ns("archive"), "stayTemp": False},
                151,
                ui=UI,
                o2={"numRecords": Int64(12)},
            )
        ],
        lambda x: [event("rename", 151, "orders", ui=UI, expanded=x, to=to, desc={"to": to})],
    )
    cases += both(
        "renameCollection-dropTarget",
        [
            entry(
                "c",
                CMD,
                {
                    "renameCollection": ORDERS,
                    "to": ns("archive"),
                    "stayTemp": False,
                    "dropTarget": ARCHIVE_UI,
                },
                152,
                ui=UI,
                o2={"numRecords": Int64(12)},
            )
        ],
        lambda x: [
            event(
                "rename",
                152,
                "orders",
                ui=UI,
                expanded=x,
                to=to,
                desc={"to": to, "dropTarget": ARCHIVE_UI},
            )
        ],
    )
    other = {"db": "archive", "coll": "orders2025"}
    cases += both(
        "renameCollection-across-databases",
        [
            entry(
                "c",
                CMD,
                {"renameCollection": ORDERS, "to": "archive.orders2025", "stayTemp": False},
                153,
                ui=UI,
                o2={"numRecords": Int64(12)},
            )
        ],
        lambda x: [event("rename", 153, "orders", ui=UI, expanded=x, to=other, desc={"to": other})],
    )
    cases += both(
        "dropDatabase",
        [entry("c", CMD, {"dropDatabase": 1}, 154)],
        lambda x: [event("dropDatabase", 154, None, ui=None, expanded=x)],
    )
    cases += both(
        "drop-then-dropDatabase",
        [
            entry("c", CMD, {"drop": "orders"}, 155, ui=UI, o2={"numRecords": Int64(0)}),
            entry("c", CMD, {"dropDatabase": 1}, 156),
        ],
        lambda x: [
            event("drop", 155, "orders", ui=UI, expanded=x),
            event("dropDatabase", 156, None, ui=None, expanded=x),
        ],
    )
    cases += both(
        "drop-admin-db-no-event",
        [
            entry(
                "c",
                "admin.$cmd",
                {"drop": "things"},
                157,
                ui=uuid_of(23),
                o2={"numRecords": Int64(0)},
            )
        ],
        lambda x: [],
    )
    return {
        "kind": "drop-rename-dropDatabase",
        "cases": cases,
        "sources": [
            "op_observer_impl.cpp OpObserverImpl::onDropCollection: o {drop: <coll>}, o2 "
            "{numRecords: "
            "NumberLong}; onRenameCollection: o {renameCollection: <from ns>, to: <to ns>, "
            "stayTemp[, dropTarget: "
            "<UUID>]}, o2 {numRecords}; onDropDatabase: {dropDatabase: 1} on <db>.$cmd, no ui",
            "change_stream_event_transform.cpp: drop (no operationDescription: token "
            "{operationType: 'drop'}); "
            "rename: `to` before _id and operationDescription = o minus renameCollection, stayTemp "
            "with `to` as "
            "{db, coll}; dropDatabase: ns {db}, no UUID (kOpsWithoutUUID)",
        ],
    }


KINDS = {
    "insert": inserts,
    "update": updates,
    "delete": deletes,
    "transaction": transactions,
    "create": creates,
    "index": indexes,
    "collmod": coll_mods,
    "system_views": views,
    "timeseries": timeseries,
    "noop": noops,
    "from_migrate": from_migrate,
    "ddl": ddl,
}


def main() -> None:
    for stem, make in KINDS.items():
        data = make()
        text = json_util.dumps(data, json_options=JSON, indent=1)
        json.loads(text)  # plain JSON, as written
        (HERE / f"{stem}.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
