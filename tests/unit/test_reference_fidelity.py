"""The audit's items (shared/reference/fidelity-audit-2026-11-26.md) that the shared transform got
wrong, each checked on the engine and on simcluster's independent reference.

The server sources are cited per test; each test runs both implementations, so a later change
to either that leaves the server's behaviour fails here."""

from __future__ import annotations

from typing import Any

import pytest

from mongoformats.update_diff import update_description_from_diff
from simcluster.reference_diff import describe_update


def _engine(diff: dict[str, Any]) -> dict[str, Any]:
    return update_description_from_diff(diff, disambiguate=True)


def _reference(diff: dict[str, Any]) -> dict[str, Any]:
    return describe_update({"$v": 2, "diff": diff}, expanded=True)


both = pytest.mark.parametrize("describe", [_engine, _reference], ids=["engine", "reference"])


@both
def test_d10_array_index_not_ambiguous(describe):
    """An array index alone never makes a path ambiguous: change_stream_document_diff_parser.cpp
    (_appendFieldToPath: "the presence of an array index is not itself sufficient to make the path
    ambiguous"); jstests/change_streams/expanded_update_description.js expects
    `disambiguatedPaths: {}` for a path of non-dotted fields and array indices."""
    push = describe({"sarr": {"a": True, "u4": 5}})
    assert push["updatedFields"] == {"arr.4": 5} and push["disambiguatedPaths"] == {}
    deep = describe(
        {
            "stopLevelArray": {
                "a": True,
                "s0": {
                    "ssubArray": {
                        "a": True,
                        "s1": {
                            "a": True,
                            "s1": {"a": True, "s0": {"sbottomArray": {"a": True, "u2": "x"}}},
                        },
                    }
                },
            }
        }
    )
    assert deep["updatedFields"] == {"topLevelArray.0.subArray.1.1.0.bottomArray.2": "x"}
    assert deep["disambiguatedPaths"] == {}


@both
def test_d10_leading_numeric_field_not_ambiguous(describe):
    """ "We don't include numeric fields at the start of the path because those are unambiguous"
    (same function): `isNumeric` needs numParts() > 1."""
    assert describe({"u": {"0": 1}})["disambiguatedPaths"] == {}
    assert describe({"s0": {"u": {"a": 1}}})["disambiguatedPaths"] == {}


@both
def test_d10_numeric_field_below_the_top_is_ambiguous(describe):
    """A numeric object field below the top level, or a dotted field anywhere, makes the path
    ambiguous from there on; indices below it are then reported as integers."""
    assert describe({"sm": {"s1": {"u": {"a": 5}}}})["disambiguatedPaths"] == {
        "m.1.a": ["m", "1", "a"]
    }
    assert describe({"sm": {"s1": {"a": True, "u0": 3}}})["disambiguatedPaths"] == {
        "m.1.0": ["m", "1", 0]
    }
    assert describe({"u": {"a.b": 1}})["disambiguatedPaths"] == {"a.b": ["a.b"]}
    assert (
        describe({"sm": {"s01": {"u": {"a": 5}}}})["disambiguatedPaths"] == {}
    )  # not strictly numeric


@both
def test_d10_order_updates_inserts_deletes_then_subdiffs(describe):
    """buildUpdateDescriptionWithDeltaOplog reads every update, then every insert, then every
    delete, then the sub-diffs, whatever the sections' order in the diff."""
    got = describe({"d": {"a.b": False}, "sx": {"u": {"y": 1}}, "i": {"e.f": 2}, "u": {"c.d": 1}})
    assert list(got["updatedFields"]) == ["c.d", "e.f", "x.y"]
    assert got["removedFields"] == ["a.b"]
    assert list(got["disambiguatedPaths"]) == ["c.d", "e.f", "a.b"]


def test_d10_fast_path_orders_updates_before_inserts():
    """The byte path (oplog_splice.update_description) takes `u` before `i` as the server reads
    them, also when a diff lists `i` first."""
    import bson

    from mongoformats.oplog_splice import elements, update_description

    diff = {"i": {"n": 1}, "d": {"gone": False}, "u": {"a": 2}}
    raw = bson.encode({"diff": diff})
    got = update_description(raw, elements(raw)[b"diff"][1], expanded=False)
    assert got == bson.encode(update_description_from_diff(diff))
    assert list(bson.decode(got)["updatedFields"]) == ["a", "n"]


# -- entry level: oplog entries shaped as a 7.0/8.0 mongod writes them, through both transforms ----


def _entry(op: str, ns: str, o: dict[str, Any], inc: int, **more: Any) -> dict[str, Any]:
    import datetime

    from bson import Int64, Timestamp

    entry = {
        "op": op,
        "ns": ns,
        **({"ui": more.pop("ui")} if "ui" in more else {}),
        "o": o,
        **more,
        "ts": Timestamp(1_700_000_000, inc),
        "t": Int64(1),
        "v": Int64(2),
        "wall": datetime.datetime(2023, 11, 14, 22, 13, 20, inc * 1000),
    }
    return entry


def _both_transforms(entries: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
    """The events of `entries` on a cluster-wide expanded stream, from the engine and from the
    reference: asserted byte-identical, returned decoded."""
    import bson

    from mongoformats.change_events import OplogTransformer
    from simcluster.reference_events import ReferenceTransformer, encode_event

    engine = OplogTransformer(show_expanded_events=True, **options)
    reference = ReferenceTransformer(
        db="admin",
        coll=None,
        cluster=True,
        expanded=True,
        migration=False,
        system_events=bool(options.get("show_system_events")),
        version=2,
        resumed_from=None,
        chain=lambda ts: [],
    )
    got, want = [], []
    for entry in entries:
        raw = bson.encode(entry)
        got += [ev.raw for ev in engine.transform(raw)]
        want += [encode_event(ev.doc) for ev in reference.events(raw)]
    assert got == want
    return [bson.decode(raw) for raw in want]


def _uuid_binary() -> Any:
    import uuid

    from bson import Binary

    return Binary(uuid.uuid4().bytes, 4)


def test_d1_view_collmod_is_a_modify_event():
    """collMod on a view is logged as a replacement of its system.views document and shown as
    `modify` with the view document as operationDescription (change_stream_event_transform.cpp,
    ChangeStreamViewDefinitionEventTransformation, case kUpdate;
    jstests/change_streams/ddl_view_events.js "Test 'collMod' command on views")."""
    views = _uuid_binary()
    view = {"_id": "db.v", "viewOn": "base", "pipeline": [{"$match": {"a": 2}}]}
    events = _both_transforms(
        [_entry("u", "db.system.views", view, 1, ui=views, o2={"_id": "db.v"})]
    )
    assert [(e["operationType"], e["ns"], e["operationDescription"]) for e in events] == [
        (
            "modify",
            {"db": "db", "coll": "v"},
            {"viewOn": "base", "pipeline": [{"$match": {"a": 2}}]},
        )
    ]
    assert "collectionUUID" not in events[0] and "stateBeforeChange" not in events[0]


def test_d2_d3_view_event_token_has_system_views_uuid_and_whole_document():
    """The token of a view event carries the `ui` of the system.views entry, and the
    operationDescription is the whole view document but `_id` (makeResumeToken's uuid argument
    and copyDocExceptFields(oField, {"_id"}) in ChangeStreamViewDefinitionEventTransformation)."""
    import uuid

    from mongoformats.resume_token import decode_token

    views = _uuid_binary()
    view = {
        "_id": "db.v",
        "viewOn": "base",
        "pipeline": [],
        "collation": {"locale": "fr", "strength": 1},
    }
    events = _both_transforms(
        [
            _entry("i", "db.system.views", view, 1, ui=views),
            _entry("d", "db.system.views", {"_id": "db.v"}, 2, ui=views),
        ]
    )
    assert [e["operationType"] for e in events] == ["create", "drop"]
    assert events[0]["operationDescription"] == {k: v for k, v in view.items() if k != "_id"}
    for event in events:
        assert decode_token(event["_id"]).uuid == uuid.UUID(bytes=bytes(views))
        assert "collectionUUID" not in event


def test_d4_system_collections_make_no_ddl_events():
    """create/createIndexes/drop of system.* collections (system.views, system.buckets.*) are not
    shown: change_stream_filter_helpers.cpp buildOperationFilter matches these commands'
    collection against kRegexAllCollections, which excludes `system.`; ddl_create_event.js
    ("the time-series create command does not produce an event")."""
    ui = _uuid_binary()
    entries = [
        _entry(
            "c",
            "db.$cmd",
            {"create": "system.views", "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
            1,
            ui=ui,
        ),
        _entry("c", "db.$cmd", {"create": "system.buckets.ts", "validator": {}}, 2, ui=ui),
        _entry(
            "c",
            "db.$cmd",
            {"createIndexes": "system.buckets.ts", "v": 2, "key": {"meta": 1}, "name": "m"},
            3,
            ui=ui,
        ),
        _entry("c", "db.$cmd", {"drop": "system.views"}, 4, ui=ui),
        _entry(
            "c",
            "db.$cmd",
            {"create": "plain", "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
            5,
            ui=ui,
        ),
    ]
    assert [(e["operationType"], e["ns"]["coll"]) for e in _both_transforms(entries)] == [
        ("create", "plain")
    ]


def test_d5_reshard_and_refine_noops_are_events():
    """buildInternalOpFilter admits the reshardCollection and refineCollectionShardKey noops, and
    the transform's kNoop case shows them with o2 minus that field as operationDescription."""
    ui = _uuid_binary()
    reshard = {
        "reshardCollection": "db.c",
        "reshardUUID": _uuid_binary(),
        "shardKey": {"k": 1},
        "oldShardKey": {"_id": 1},
        "unique": False,
        "numInitialChunks": 1,
        "provenance": "reshardCollection",
    }
    refine = {
        "refineCollectionShardKey": "db.c",
        "shardKey": {"a": 1, "b": 1},
        "oldShardKey": {"a": 1},
    }
    events = _both_transforms(
        [
            _entry("n", "db.c", {"msg": {"reshardCollection": "db.c"}}, 1, ui=ui, o2=reshard),
            _entry("n", "db.c", {"msg": {"refineCollectionShardKey": "db.c"}}, 2, ui=ui, o2=refine),
        ]
    )
    assert [(e["operationType"], e["ns"], e["operationDescription"]) for e in events] == [
        (
            "reshardCollection",
            {"db": "db", "coll": "c"},
            {k: v for k, v in reshard.items() if k != "reshardCollection"},
        ),
        (
            "refineCollectionShardKey",
            {"db": "db", "coll": "c"},
            {k: v for k, v in refine.items() if k != "refineCollectionShardKey"},
        ),
    ]


def test_d6a_create_and_create_indexes_inside_a_transaction():
    """A transaction that creates its collection holds create and createIndexes in its applyOps;
    they are events with the transaction's txnNumber and lsid and their own txnOpIndex
    (buildTransactionFilter; jstests/change_streams/ddl_create_index_txn.js)."""
    from bson import Int64

    from mongoformats.resume_token import decode_token

    ui = _uuid_binary()
    lsid = {"id": _uuid_binary(), "uid": b"\x01" * 32}
    ops = [
        {
            "op": "c",
            "ns": "db.$cmd",
            "ui": ui,
            "o": {"create": "t", "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
        },
        {
            "op": "c",
            "ns": "db.$cmd",
            "ui": ui,
            "o": {"createIndexes": "t", "v": 2, "key": {"unused": 1}, "name": "unused_1"},
        },
        {"op": "i", "ns": "db.t", "ui": ui, "o": {"_id": 1}, "o2": {"_id": 1}},
    ]
    entry = _entry(
        "c",
        "admin.$cmd",
        {"applyOps": ops},
        1,
        lsid=lsid,
        txnNumber=Int64(3),
        prevOpTime={"ts": __import__("bson").Timestamp(0, 0), "t": Int64(-1)},
    )
    events = _both_transforms([entry])
    assert [e["operationType"] for e in events] == ["create", "createIndexes", "insert"]
    assert [decode_token(e["_id"]).txn_op_index for e in events] == [0, 1, 2]
    for event in events:
        assert list(event)[:3] == ["txnNumber", "lsid", "_id"] and event["txnNumber"] == 3
    assert events[1]["operationDescription"] == {
        "indexes": [{"v": 2, "key": {"unused": 1}, "name": "unused_1"}]
    }
