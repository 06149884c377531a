"""simcluster against unmodified pymongo over real sockets: CRUD, oplog shapes, events, bad input.

Expected oplog shapes cite shared/reference/mongodb-formats.md (section C), which gives the
server source and real transcripts each shape comes from.
"""

from __future__ import annotations

import concurrent.futures
import socket
import struct
import uuid

import bson
import pytest
import trio
from bson import Int64, MaxKey, MinKey, Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo.errors import DuplicateKeyError, OperationFailure, WriteError

from mongoformats import wire
from mongoformats.change_events import RAW, OplogTransformer
from mongoformats.errors import MongoError
from mongoformats.resume_token import decode_token, high_water_mark, token_sort_key
from simcluster import open_cluster
from tests.conftest import client, sync, wait_until
from tests.integration.test_accelerate import _collect
from tests.integration.test_engine import drain
from wireproxy.upstream import open_upstream

STRIP = ("ts", "t", "v", "wall", "ui", "lsid", "txnNumber", "stmtId", "prevOpTime")


def _shard_with(cluster, db):
    return cluster.mongos.primary_of(db)


def _oplog_tail(node, n):
    entries = node.oplog.read_after(0, 1 << 30)[-n:]
    return [bson.decode(e) for e in entries]


def _shape(entry):
    return {k: v for k, v in entry.items() if k not in STRIP}


async def test_crud_and_errors(cluster):
    def work():
        c = client(cluster.uri)
        coll = c.t.c
        coll.insert_many([{"_id": i, "n": i} for i in range(5)])
        coll.create_index("n", unique=True)
        with pytest.raises(DuplicateKeyError) as info:
            coll.insert_one({"_id": 99, "n": 1})
        assert info.value.details["keyPattern"] == {"n": 1}
        assert (
            coll.find_one_and_update({"_id": 2}, {"$inc": {"n": 10}}, return_document=True)["n"]
            == 12
        )
        assert [d["_id"] for d in coll.find({"n": {"$gte": 3}}).sort("n", -1)] == [2, 4, 3]
        assert coll.count_documents({"n": {"$in": [0, 1]}}) == 2
        assert sorted(coll.distinct("n")) == [0, 1, 3, 4, 12]
        # A path through an index past an array's end pads it with nulls, as the server does; a
        # scalar in a path's way is PathNotViable (28), the document unchanged.
        coll.insert_one({"_id": "arr", "arr": [1], "s": 5})
        coll.update_one({"_id": "arr"}, {"$set": {"arr.2.q": 1}})
        assert coll.find_one({"_id": "arr"})["arr"] == [1, None, {"q": 1}]
        for path in ("arr.0.q", "s.t", "s.t.u", "arr.x"):
            with pytest.raises(WriteError) as write_error:
                coll.update_one({"_id": "arr"}, {"$set": {path: 2}})
            assert write_error.value.code == 28, path
        assert coll.find_one({"_id": "arr"}) == {"_id": "arr", "arr": [1, None, {"q": 1}], "s": 5}
        with pytest.raises(OperationFailure) as err:
            c.t.command("noSuchCommand")
        assert err.value.code == 59 and err.value.details["codeName"] == "CommandNotFound"
        hello = c.admin.command("hello")
        assert hello["msg"] == "isdbgrid" and hello["maxWireVersion"] == 21
        member = client(cluster.shard_uri("shard0")).admin.command("hello")
        assert (
            member["setName"] == "shard0" and member["isWritablePrimary"] and "lastWrite" in member
        )

    await sync(work)


async def test_malformed_frames_never_kill_a_node(cluster):
    def work():
        host, port = cluster.mongos.address.split(":")
        for junk in (
            struct.pack("<iiii", 8, 1, 0, 2013),
            struct.pack("<iiii", 40, 1, 0, 7777) + b"\x00" * 24,
            b"\xff" * 64,
        ):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(junk)
                s.settimeout(5)
                assert s.recv(100) == b""  # closed, no crash
        assert client(cluster.uri).admin.command("ping")["ok"] == 1.0

    await sync(work)


async def test_oplog_shapes_for_a_table_of_writes(cluster):
    node = _shard_with(cluster, "shapes")

    def work():
        c = client(cluster.uri)
        coll = c.shapes.c
        coll.insert_one({"_id": 1, "a": 1, "n": 5, "arr": [1, 2], "x": {"y": 1}})
        coll.update_one({"_id": 1}, {"$set": {"a": 2}})
        coll.update_one({"_id": 1}, {"$set": {"b": 1}})
        coll.update_one({"_id": 1}, {"$unset": {"b": ""}})
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}})
        coll.update_one({"_id": 1}, {"$push": {"arr": 7}})
        coll.update_one({"_id": 1}, {"$set": {"x.y": 5}})
        coll.update_one({"_id": 1}, {"$pop": {"arr": 1}})
        coll.replace_one({"_id": 1}, {"z": 1})
        coll.delete_one({"_id": 1})
        coll.create_index("a")
        c.shapes.command({"collMod": "c", "validationLevel": "moderate"})
        coll.drop_index("a_1")
        c.admin.command({"renameCollection": "shapes.c", "to": "shapes.d"})
        c.shapes.drop_collection("d")
        c.drop_database("shapes")
        c.admin.command("appendOplogNote", data={"hi": 1})

    await sync(work)
    # The note went to the shard mongos targets for admin commands: read it from every shard.
    entries = _oplog_tail(node, 17)
    shapes = [_shape(e) for e in entries[:16]]
    expected = [
        # C.2: inserts carry o2 = documentKey since 5.3
        {
            "op": "i",
            "ns": "shapes.c",
            "o": {"_id": 1, "a": 1, "n": 5, "arr": [1, 2], "x": {"y": 1}},
            "o2": {"_id": 1},
        },
        # C.3: $v:2 diffs; u for an existing field, i for a new one, d for a removed one
        {"op": "u", "ns": "shapes.c", "o": {"$v": 2, "diff": {"u": {"a": 2}}}, "o2": {"_id": 1}},
        {"op": "u", "ns": "shapes.c", "o": {"$v": 2, "diff": {"i": {"b": 1}}}, "o2": {"_id": 1}},
        {
            "op": "u",
            "ns": "shapes.c",
            "o": {"$v": 2, "diff": {"d": {"b": False}}},
            "o2": {"_id": 1},
        },
        {"op": "u", "ns": "shapes.c", "o": {"$v": 2, "diff": {"u": {"n": 6}}}, "o2": {"_id": 1}},
        # array diffs: {a: true, u<idx>: value}; $push that appends logs only the new elements
        {
            "op": "u",
            "ns": "shapes.c",
            "o": {"$v": 2, "diff": {"sarr": {"a": True, "u2": 7}}},
            "o2": {"_id": 1},
        },
        {
            "op": "u",
            "ns": "shapes.c",
            "o": {"$v": 2, "diff": {"sx": {"u": {"y": 5}}}},
            "o2": {"_id": 1},
        },
        # $pop logs the whole array (ModifierNode's log); only pipeline updates' diffs truncate (l)
        {
            "op": "u",
            "ns": "shapes.c",
            "o": {"$v": 2, "diff": {"u": {"arr": [1, 2]}}},
            "o2": {"_id": 1},
        },
        # C.4 replacement: o is the whole new document with _id
        {"op": "u", "ns": "shapes.c", "o": {"_id": 1, "z": 1}, "o2": {"_id": 1}},
        # C.5 delete: o is the documentKey
        {"op": "d", "ns": "shapes.c", "o": {"_id": 1}},
        # C.8 DDL on <db>.$cmd
        {
            "op": "c",
            "ns": "shapes.$cmd",
            "o": {"createIndexes": "c", "v": 2, "key": {"a": 1}, "name": "a_1"},
        },
        # D15: the options before the change start with the collection's uuid
        # (CollectionOptions::appendBSON; jstests/change_streams/ddl_coll_mod_event.js)
        {
            "op": "c",
            "ns": "shapes.$cmd",
            "o": {"collMod": "c", "validationLevel": "moderate"},
            "o2": {"collectionOptions_old": {"uuid": entries[11]["ui"]}},
        },
        {
            "op": "c",
            "ns": "shapes.$cmd",
            "o": {"dropIndexes": "c", "index": "a_1"},
            "o2": {"v": 2, "key": {"a": 1}, "name": "a_1"},
        },
        {
            "op": "c",
            "ns": "shapes.$cmd",
            "o": {"renameCollection": "shapes.c", "to": "shapes.d", "stayTemp": False},
        },
        {"op": "c", "ns": "shapes.$cmd", "o": {"drop": "d"}, "o2": {"numRecords": 0}},
        {"op": "c", "ns": "shapes.$cmd", "o": {"dropDatabase": 1}},
    ]
    assert shapes == expected
    assert type(bson.decode(node.oplog.read_after(0, 1 << 30)[-17])["o"]["n"]) is int  # Int32 kept
    # Field order of a retryable insert: the server's OplogEntryBase IDL serializes its chained
    # structs first (OperationSessionInfo, DurableReplOperation, OpTimeBase), then v, wall and
    # prevOpTime (mongo src/mongo/db/repl/oplog_entry.idl).
    insert = node.oplog.read_after(0, 1 << 30)[-17]
    assert list(bson.decode(insert)) == [
        "lsid",
        "txnNumber",
        "op",
        "ns",
        "ui",
        "o",
        "o2",
        "stmtId",
        "ts",
        "t",
        "v",
        "wall",
        "prevOpTime",
    ]
    assert bson.decode(insert)["v"] == Int64(2)


async def test_events_from_the_oplog_entries(cluster):
    node = _shard_with(cluster, "ev")

    def work():
        c = client(cluster.uri)
        c.ev.c.insert_one({"_id": 1, "arr": [1, 2, 3], "pad": "x" * 40})
        c.ev.c.update_one({"_id": 1}, {"$set": {"arr.0": 9}, "$unset": {"gone": ""}})
        # A pipeline update is logged as the documents' diff, where a shorter array is a truncation.
        c.ev.c.update_one({"_id": 1}, [{"$set": {"arr": [9, 2]}}])
        c.ev.c.create_index("arr")

    await sync(work)
    tr = OplogTransformer(show_expanded_events=True)
    events = []
    for raw in node.oplog.read_after(0, 1 << 30):
        events += [bson.decode(e.raw) for e in tr.transform(RawBSONDocument(raw, RAW))]
    kinds = [e["operationType"] for e in events]
    assert kinds == ["create", "insert", "update", "update", "createIndexes"]
    insert = events[1]
    # C.11 field order with showExpandedEvents
    assert list(insert) == [
        "_id",
        "operationType",
        "clusterTime",
        "collectionUUID",
        "wallTime",
        "fullDocument",
        "ns",
        "documentKey",
    ]
    token = decode_token(insert["_id"])
    assert token.version == 2 and token.event_identifier == {
        "operationType": "insert",
        "documentKey": {"_id": 1},
    }
    # An array index alone is not ambiguous (change_stream_document_diff_parser.cpp; audit D10).
    assert events[2]["updateDescription"] == {
        "updatedFields": {"arr.0": 9},
        "removedFields": [],
        "truncatedArrays": [],
        "disambiguatedPaths": {},
    }
    # the spec test "Test array truncation" shape
    assert events[3]["updateDescription"]["truncatedArrays"] == [{"field": "arr", "newSize": 2}]
    assert events[4]["operationDescription"] == {
        "indexes": [{"v": 2, "key": {"arr": 1}, "name": "arr_1"}]
    }


async def test_pipeline_updates_log_a_diff_or_the_whole_document_as_a_server_does(cluster):
    """The server compares the documents for a pipeline update and logs the diff only when it is
    smaller than the new document (with the `$v`/`diff` wrapper's 15 bytes): else the whole
    document, which a change stream shows as a replace. `_id` is kept when the pipeline drops it
    and may not change."""
    node = _shard_with(cluster, "pu")

    def work():
        coll = client(cluster.uri).pu.c
        coll.insert_many([{"_id": 1, "a": 1, "pad": "x" * 60}, {"_id": 2, "a": 1}])
        coll.update_one({"_id": 1}, [{"$set": {"a": 2}}])
        coll.update_one({"_id": 2}, [{"$set": {"a": 2}}])
        coll.update_one({"_id": 1}, [{"$replaceWith": {"$mergeObjects": ["$$ROOT", {"b": "$a"}]}}])
        coll.update_one(
            {"_id": 1}, [{"$replaceWith": {"pad": "$pad", "b": "$b"}}]
        )  # no _id: kept, first
        coll.update_one({"_id": 2}, [{"$unset": "a"}, {"$set": {"z": {"$concat": ["p", "q"]}}}])
        with pytest.raises(OperationFailure) as info:
            coll.update_one({"_id": 2}, [{"$replaceWith": {"_id": 3}}])
        assert info.value.code == 66
        with pytest.raises(OperationFailure) as info:
            coll.update_one({"_id": 2}, [{"$group": {"_id": 1}}])
        assert info.value.code == 72  # InvalidOptions: not a stage an update may hold
        return list(coll.find({}, sort=[("_id", 1)]))

    docs = await sync(work)
    assert docs == [{"_id": 1, "pad": "x" * 60, "b": 2}, {"_id": 2, "z": "pq"}]
    assert list(docs[0]) == ["_id", "pad", "b"]
    updates = [bson.decode(e) for e in node.oplog.read_after(0, 1 << 30)]
    updates = [e["o"] for e in updates if e["op"] == "u" and e["ns"] == "pu.c"]
    assert updates == [
        {"$v": 2, "diff": {"u": {"a": 2}}},
        {"_id": 2, "a": 2},  # the diff would not be smaller: the whole document
        {"$v": 2, "diff": {"i": {"b": 2}}},
        {"$v": 2, "diff": {"d": {"a": False}}},
        {"_id": 2, "z": "pq"},
    ]


async def test_operator_updates_log_what_each_operator_did(cluster):
    """Operators apply in path order and are logged as the server's log builder logs them: a value
    set whole stays whole, an append logs the new elements, `$[]`/`$[<id>]`/`$` reach the elements
    they select; nothing is logged (and nModified is 0) when nothing changed."""
    node = _shard_with(cluster, "ou")

    def work():
        coll = client(cluster.uri).ou.c
        coll.insert_one(
            {"_id": 1, "sub": {"x": 0, "y": 1}, "arr": [{"q": 1}, {"q": 2}], "tags": ["a"]}
        )
        coll.update_one({"_id": 1}, {"$set": {"z": 1, "sub": {"x": 1}, "a": 1, "10": 1, "9": 1}})
        coll.update_one(
            {"_id": 1}, {"$inc": {"arr.$[].q": 1}, "$push": {"tags": {"$each": ["b", "c"]}}}
        )
        coll.update_one(
            {"_id": 1}, {"$set": {"arr.$[e].r": True}}, array_filters=[{"e.q": {"$gt": 2}}]
        )
        coll.update_one({"_id": 1, "arr.q": 2}, {"$unset": {"arr.$.q": ""}, "$pull": {"tags": "a"}})
        assert (
            coll.update_one(
                {"_id": 1}, {"$set": {"z": 1}, "$addToSet": {"tags": "b"}}
            ).modified_count
            == 0
        )
        with pytest.raises(OperationFailure) as info:
            coll.update_one({"_id": 1}, {"$set": {"sub.x": 2}, "$inc": {"sub": 1}})
        assert info.value.code == 40  # ConflictingUpdateOperators
        return coll.find_one({"_id": 1})

    doc = await sync(work)
    assert list(doc) == [
        "_id",
        "sub",
        "arr",
        "tags",
        "9",
        "10",
        "a",
        "z",
    ]  # new fields in path order
    assert doc["arr"] == [{}, {"q": 3, "r": True}] and doc["tags"] == ["b", "c"]
    updates = [bson.decode(e) for e in node.oplog.read_after(0, 1 << 30)]
    updates = [e["o"]["diff"] for e in updates if e["op"] == "u" and e["ns"] == "ou.c"]
    assert updates == [
        {"u": {"sub": {"x": 1}}, "i": {"9": 1, "10": 1, "a": 1, "z": 1}},
        {
            "sarr": {"a": True, "s0": {"u": {"q": 2}}, "s1": {"u": {"q": 3}}},
            "stags": {"a": True, "u1": "b", "u2": "c"},
        },
        {"sarr": {"a": True, "s1": {"i": {"r": True}}}},
        {"sarr": {"a": True, "s0": {"d": {"q": False}}}, "u": {"tags": ["b", "c"]}},
    ]


async def test_change_stream_fails_when_the_pipeline_modifies_the_resume_token(cluster):
    def work():
        c = client(cluster.shard_uri("shard0"))
        with c.m.c.watch(
            [{"$addFields": {"_id": {"_data": "00"}}}], max_await_time_ms=200
        ) as stream:
            c.m.c.insert_one({"_id": 1})
            with pytest.raises(OperationFailure) as info:
                while stream.try_next() is None:
                    pass
        assert info.value.code == 280 and info.value.has_error_label(
            "NonResumableChangeStreamError"
        )

    await sync(work)


async def test_transactions_single_and_cross_shard(cluster):
    """Oplog shapes of mongodb-formats.md C.6: one applyOps for a one-shard commit; prepare +
    commitTransaction (same commitTimestamp, each shard its own ts) across shards; nothing for an
    abort. The events carry lsid, txnNumber and txnOpIndex, and share the committing entry's ts."""

    def work():
        c = client(cluster.uri)
        c.admin.command("enableSharding", "tx")
        c.admin.command("shardCollection", "tx.h", key={"_id": "hashed"})
        c.tx.one.insert_one({"_id": 0})
        c.tx.h.insert_one({"_id": -1})
        with c.start_session() as s:
            s.with_transaction(
                lambda s: (
                    c.tx.one.insert_one({"_id": 1}, session=s),
                    c.tx.one.update_one({"_id": 0}, {"$set": {"a": 1}}, session=s),
                )
            )
        with c.start_session() as s:
            s.with_transaction(
                lambda s: c.tx.h.insert_many([{"_id": i} for i in range(12)], session=s)
            )
        with c.start_session() as s:
            s.start_transaction()
            c.tx.one.insert_one({"_id": 99}, session=s)
            s.abort_transaction()
        assert c.tx.one.count_documents({"_id": 99}) == 0 and c.tx.h.count_documents({}) == 13
        with pytest.raises(OperationFailure) as info:  # a statement of a transaction never started
            c.tx.command(
                {
                    "find": "one",
                    "lsid": {"id": bson.Binary(b"x" * 16, 4)},
                    "txnNumber": Int64(5),
                    "autocommit": False,
                }
            )
        assert info.value.code == 251 and info.value.has_error_label("TransientTransactionError")

    await sync(work)
    entries = {
        sid: [bson.decode(r) for r in node.oplog.read_after(0, 1 << 30)]
        for sid, node in cluster.shards.items()
    }
    txn_entries = {
        sid: [e for e in es if e.get("ns") == "admin.$cmd"] for sid, es in entries.items()
    }
    single = [
        e
        for es in txn_entries.values()
        for e in es
        if "prepare" not in e["o"] and "applyOps" in e["o"]
    ]
    assert len(single) == 1
    assert [op["op"] for op in single[0]["o"]["applyOps"]] == ["i", "u"]
    assert list(single[0]) == [
        "lsid",
        "txnNumber",
        "op",
        "ns",
        "o",
        "ts",
        "t",
        "v",
        "wall",
        "prevOpTime",
    ]
    prepared = {sid: [e for e in es if e["o"].get("prepare")] for sid, es in txn_entries.items()}
    commits = {
        sid: [e for e in es if "commitTransaction" in e["o"]] for sid, es in txn_entries.items()
    }
    participants = [sid for sid in prepared if prepared[sid]]
    assert len(participants) >= 2
    (commit_ts,) = {commits[sid][0]["o"]["commitTimestamp"] for sid in participants}
    for sid in participants:
        assert commits[sid][0]["ts"] >= commit_ts >= prepared[sid][0]["ts"]
        assert commits[sid][0]["prevOpTime"]["ts"] == prepared[sid][0]["ts"]
    # Events: every op of a transaction at the committing entry's ts, txnOpIndex counting up.
    events = []
    for node in cluster.shards.values():
        tr = OplogTransformer()
        events += [
            bson.decode(e.raw)
            for raw in node.oplog.read_after(0, 1 << 30)
            for e in tr.transform(RawBSONDocument(raw, RAW))
        ]
    in_txn = [e for e in events if "txnNumber" in e]
    assert len(in_txn) == 2 + 12
    assert all(list(e)[:3] == ["txnNumber", "lsid", "_id"] for e in in_txn)
    assert sorted(
        decode_token(e["_id"]).txn_op_index for e in in_txn if e["ns"]["coll"] == "one"
    ) == [0, 1]
    assert not [e for e in events if e.get("documentKey", {}).get("_id") == 99]


async def test_inserts_spliced_from_the_sent_bytes_log_the_same_entries():
    """insert_sent (the bytes the driver sent) and insert_one (documents as dicts) write the same
    entries: field order, values and BSON types, with and without a session."""
    from bson import Int64

    from simcluster.query import run_inserts

    async with open_cluster(shards=1) as cluster:
        node = cluster.shards["shard0"]
        docs = [
            {"_id": 1, "a": "x"},
            {"_id": "s", "b": [1, Int64(2)]},
            {"_id": {"k": 1.5}, "c": None},
        ]
        for with_session in (False, True):

            def session(n: int, on: bool = with_session) -> dict:
                # A statement is done once per (lsid, txnNumber, stmtId): each command its own
                # session.
                return (
                    {"lsid": {"id": bson.Binary(bytes([n]) * 16, 4)}, "txnNumber": Int64(5)}
                    if on
                    else {}
                )

            since = node.oplog.last_key()
            run_inserts(
                "db.sent",
                {
                    "insert": "sent",
                    "documents": docs,
                    **session(1),
                    "$raw_documents": [bson.encode(d) for d in docs],
                },
                lambda d: node,
            )
            run_inserts(
                "db.dicts", {"insert": "dicts", "documents": docs, **session(2)}, lambda d: node
            )
            entries = [bson.decode(r) for r in node.oplog.read_after(since, 1000)]
            varying = ("ts", "wall", "ui", "ns", "lsid")
            sent = [
                bson.encode({k: v for k, v in e.items() if k not in varying})
                for e in entries
                if e.get("ns") == "db.sent"
            ]
            dicts = [
                bson.encode({k: v for k, v in e.items() if k not in varying})
                for e in entries
                if e.get("ns") == "db.dicts"
            ]
            assert sent == dicts and len(sent) == 3
            node.dbs.clear()  # the same documents again in the next round


async def test_find_and_modify_updates_the_element_its_query_matched(cluster):
    """A positional `$` path in findAndModify reaches the array element the query matched."""

    def work():
        coll = client(cluster.uri).fm.c
        coll.insert_one({"_id": 1, "arr": [{"k": 1}, {"k": 2}]})
        return coll.find_one_and_update(
            {"arr.k": 2}, {"$set": {"arr.$.hit": True}}, return_document=True
        )

    doc = await sync(work)
    assert doc["arr"] == [{"k": 1}, {"k": 2, "hit": True}]


async def test_a_dotted_exclusion_removes_the_nested_field(cluster):
    """find's exclusion projection and $unset (an exclusion $project) remove dotted paths, through
    arrays."""

    def work():
        coll = client(cluster.uri).px.c
        coll.insert_one({"_id": 1, "a": 1, "b": {"c": 2, "e": 3}, "arr": [{"c": 1, "k": 2}, 5]})
        found = coll.find_one({}, {"b.c": 0, "arr.c": 0})
        unset = next(coll.aggregate([{"$unset": ["a", "b.c"]}]))
        return found, unset, coll.find_one()

    found, unset, stored = await sync(work)
    assert found == {"_id": 1, "a": 1, "b": {"e": 3}, "arr": [{"k": 2}, 5]}
    assert unset == {"_id": 1, "b": {"e": 3}, "arr": [{"c": 1, "k": 2}, 5]}
    assert stored["b"] == {"c": 2, "e": 3}  # the stored document is untouched


async def test_find_projections_follow_the_project_rules_and_refuse_find_only_forms(cluster):
    """Since 4.4 a find projection is a $project (mongoformats/projection.py): dotted inclusions
    through arrays, the input's field order, expressions. $slice, $elemMatch and positional
    projections are not simulated: NotImplemented, never a wrong document."""

    def work():
        coll = client(cluster.uri).fp.c
        coll.insert_one(
            {"_id": 1, "z": 0, "b": {"c": 2, "e": 3}, "arr": [{"c": 1, "k": 2}, 5], "v": 4}
        )
        got = [
            coll.find_one({}, spec)
            for spec in (
                {"v": 1, "b.c": 1},
                {"arr.c": 1, "_id": 0},
                {"w": {"$add": ["$v", 1]}, "z": 1},
            )
        ]
        for spec in ({"arr": {"$slice": 1}}, {"arr": {"$elemMatch": {"c": 1}}}, {"arr.$": 1}):
            with pytest.raises(OperationFailure) as err:
                coll.find_one({"arr.c": 1}, spec)
            assert err.value.code == 238
        return got

    assert await sync(work) == [
        {"_id": 1, "b": {"c": 2}, "v": 4},
        {"arr": [{"c": 1}]},
        {"_id": 1, "z": 0, "w": 5},
    ]


async def test_aggregate_expressions_are_the_shared_evaluator_with_simclusters_own_operators(
    cluster,
):
    """simcluster's stages evaluate expressions with mongoformats/expressions.py (paths through
    arrays, $concat's errors, an undefined variable as the server reports it) plus its own
    operators ($ifNull, $size, $getField, ...); an operator or system variable it does not know
    is NotImplemented, never a document that treats the operator as a field name."""

    def work():
        coll = client(cluster.uri).ag.c
        coll.insert_one({"_id": 1, "s": "a", "arr": [{"k": 1}, {"k": 2}, 3], "n": 4})
        got = next(
            coll.aggregate(
                [
                    {
                        "$project": {
                            "_id": 0,
                            "ks": "$arr.k",
                            "c": {"$concat": ["$s", "-", {"$ifNull": ["$none", "z"]}]},
                            "size": {"$size": "$arr"},
                            "f": {"$getField": "n"},
                            "sum": {"$add": ["$n", {"$size": ["$arr"]}]},
                            "in": {"$in": ["$s", ["a", "b"]]},
                        }
                    }
                ]
            )
        )
        codes = []
        for expression in ({"$concat": ["$s", "$n"]}, "$$nope", "$$NOW", {"$toLower": "$s"}):
            with pytest.raises(OperationFailure) as err:
                list(coll.aggregate([{"$project": {"x": expression}}]))
            codes.append(err.value.code)
        return got, codes

    got, codes = await sync(work)
    assert got == {"ks": [1, 2], "c": "a-z", "size": 3, "f": 4, "sum": 7, "in": True}
    assert codes == [16702, 17276, 238, 238]


async def test_killing_a_cursor_interrupts_its_getmore_and_killsessions_closes_a_sessions_cursors(
    cluster,
):
    """As on the server: killCursors on a cursor a getMore has checked out fails that getMore
    with CursorKilled (237); killSessions and killAllSessions close the cursors opened in those
    sessions, and no others."""
    import threading
    import time

    def work():
        c = client(cluster.uri)
        c.ks.c.insert_many([{"i": i} for i in range(5)])
        stream = c.ks.c.watch(max_await_time_ms=20_000)  # a tailable awaitData cursor on mongos
        cid = stream._cursor.cursor_id
        failure: list[OperationFailure] = []

        def wait() -> None:
            try:
                c.ks.command({"getMore": cid, "collection": "c", "maxTimeMS": 20_000})
            except OperationFailure as exc:
                failure.append(exc)

        waiter = threading.Thread(target=wait)
        started = time.monotonic()
        waiter.start()
        wait_until(
            lambda: cluster.mongos.cursors.get(cid, "ks.c").busy, timeout=10
        )  # parked in its wait
        other = client(cluster.uri)
        assert other.ks.command({"killCursors": "c", "cursors": [cid]})["cursorsKilled"] == [cid]
        waiter.join(10)
        assert failure and failure[0].code == 237 and time.monotonic() - started < 5
        assert failure[0].details["errmsg"] == "operation was interrupted"

        with c.start_session() as s, c.start_session() as bystander:
            mine = c.ks.command({"find": "c", "batchSize": 1}, session=s)["cursor"]["id"]
            theirs = c.ks.command({"find": "c", "batchSize": 1}, session=bystander)["cursor"]["id"]
            outside = c.ks.command({"find": "c", "batchSize": 1})["cursor"][
                "id"
            ]  # implicit session
            c.admin.command({"killSessions": [s.session_id]})
            with pytest.raises(OperationFailure) as info:
                c.ks.command({"getMore": mine, "collection": "c", "batchSize": 1}, session=s)
            assert info.value.code == 43
            c.ks.command({"getMore": theirs, "collection": "c", "batchSize": 1}, session=bystander)
            c.admin.command({"killAllSessions": []})
            for cursor_id, session in ((theirs, bystander), (outside, None)):
                with pytest.raises(OperationFailure) as info:
                    c.ks.command(
                        {"getMore": cursor_id, "collection": "c", "batchSize": 1}, session=session
                    )
                assert info.value.code == 43

    await sync(work)


async def test_an_oplog_scan_ends_its_cursor_at_its_limit_or_single_batch(cluster):
    """As on a server, no cursor is left open (to time out) once a find returned its `limit` or
    the one batch it asked for."""
    member = cluster.replsets["shard0"].members[0]
    conn = await open_upstream(member.host, member.port)
    try:
        await conn.command("ol", {"insert": "c", "documents": [{"_id": i} for i in range(5)]})
        one = {
            "find": "oplog.rs",
            "filter": {},
            "sort": {"$natural": 1},
            "limit": 1,
            "singleBatch": True,
        }
        assert (await conn.command("local", one))["cursor"]["id"] == 0
        first = await conn.command(
            "local", {"find": "oplog.rs", "filter": {}, "singleBatch": True, "batchSize": 1}
        )
        assert first["cursor"]["id"] == 0
        two = await conn.command(
            "local", {"find": "oplog.rs", "filter": {}, "limit": 2, "batchSize": 1}
        )
        more = await conn.command(
            "local", {"getMore": two["cursor"]["id"], "collection": "oplog.rs"}
        )
        assert len(more["cursor"]["nextBatch"]) == 1 and more["cursor"]["id"] == 0
        assert len(member.cursors) == 0
    finally:
        await conn.aclose()


async def test_idle_cursors_opened_outside_sessions_time_out(cluster):
    """cursorTimeoutMillis, on mongos and on a shard member alike: the cursor monitor (every 4 s)
    kills a session-less cursor no getMore has used for that long, and its next getMore finds
    no cursor (CursorNotFound, 43; serverStatus counts it in metrics.cursor.timedOut). A cursor
    opened in a session, or with noCursorTimeout, stays."""
    member = cluster.replsets["shard0"].members[0]
    for host, port in ((cluster.mongos.host, cluster.mongos.port), (member.host, member.port)):
        conn = await open_upstream(host, port)  # no session: as the proxy's readers send commands
        try:
            await conn.command("admin", {"setParameter": 1, "cursorTimeoutMillis": 300})
            await conn.command("to", {"insert": "c", "documents": [{"_id": i} for i in range(6)]})
            session = {"lsid": {"id": bson.Binary(uuid.uuid4().bytes, 4)}}
            ids = {}
            for kind, extra in (
                ("plain", {}),
                ("session", session),
                ("noCursorTimeout", {"noCursorTimeout": True}),
            ):
                ids[kind] = (await conn.command("to", {"find": "c", "batchSize": 1, **extra}))[
                    "cursor"
                ]["id"]
            with trio.fail_after(15):
                while not (await conn.command("admin", {"serverStatus": 1}))["metrics"]["cursor"][
                    "timedOut"
                ]:
                    await trio.sleep(0.2)
            with pytest.raises(MongoError) as info:
                await conn.command("to", {"getMore": ids["plain"], "collection": "c"})
            assert info.value.code == 43
            for kind, extra in (("session", session), ("noCursorTimeout", {})):
                more = {"getMore": ids[kind], "collection": "c", "batchSize": 1, **extra}
                assert len((await conn.command("to", more))["cursor"]["nextBatch"]) == 1
            await conn.command("to", {"drop": "c"})
        finally:
            await conn.aclose()


async def test_the_balancer_moves_ranges_of_the_chunk_size_until_shards_differ_by_less_than_three(
    cluster,
):
    """7.0's balancer (simcluster/balancer.py): on by default; at the default 128 MB chunk size a
    few MB never move; at 1 MB, ranges of about 1 MB move from the fullest shard while shards differ
    by 3 MB or more. Nothing is lost or doubled, and a change stream sees none of it."""

    def work():
        c = client(cluster.uri)
        admin = c.admin
        assert admin.command("balancerStatus")["mode"] == "full"
        admin.command(
            "configureFailPoint",
            "overrideBalanceRoundInterval",
            mode="alwaysOn",
            data={"intervalMs": 20},
        )
        admin.command(
            "balancerStart"
        )  # ends the pause the round interval was set during, as on a server
        start = admin.command("ping")["operationTime"]
        admin.command("shardCollection", "bal.c", key={"k": 1})
        pad = "x" * 10_000
        c.bal.c.insert_many(
            [{"_id": i, "k": i, "pad": pad} for i in range(500)]
        )  # 4.8 MB on one shard
        rounds = admin.command("balancerStatus")["numBalancerRounds"]
        wait_until(
            lambda: admin.command("balancerStatus")["numBalancerRounds"] > rounds + 3, timeout=10
        )
        status = admin.command("balancerCollectionStatus", "bal.c")
        assert (status["chunkSize"], status["balancerCompliant"]) == (128.0, True)
        assert len(cluster.mongos.sharded["bal.c"].chunks) == 1

        for bad in (-1, 1025, "1"):
            with pytest.raises(OperationFailure) as err:
                admin.command("configureCollectionBalancing", "bal.c", chunkSize=bad)
            assert err.value.code == 72  # InvalidOptions
        admin.command("balancerStop")
        admin.command("configureCollectionBalancing", "bal.c", chunkSize=1)
        status = admin.command("balancerCollectionStatus", "bal.c")
        assert (status["balancerCompliant"], status["firstComplianceViolation"]) == (
            False,
            "chunksImbalance",
        )
        admin.command("balancerStart")
        wait_until(
            lambda: admin.command("balancerCollectionStatus", "bal.c")["balancerCompliant"],
            timeout=20,
        )

        counts = {
            sid: client(cluster.shard_uri(sid)).bal.c.count_documents({})
            for sid in sorted(cluster.replsets)
        }
        # 4.8 MB: 1 MB goes to each empty shard (one migration per shard per round), then 2.8 - 1 <
        # 3.
        assert sorted(counts.values()) == [104, 104, 292], counts
        assert sum(counts.values()) == c.bal.c.count_documents({}) == 500
        for sid, n in counts.items():  # each shard holds the keys of its own chunks
            keys = [d["k"] for d in client(cluster.shard_uri(sid)).bal.c.find({}, {"k": 1})]
            assert (
                all(cluster.mongos.sharded["bal.c"].owner(k) == sid for k in keys)
                and len(keys) == n
            )

        admin.command("balancerStop")
        stopped = admin.command("balancerStatus")
        assert stopped["mode"] == "off"
        c.bal.c.insert_one({"_id": "end", "k": 10_000})
        admin.command(
            "appendOplogNote", data={"test": "end"}
        )  # every shard past the end: no wait for idle ones
        stream = c.bal.c.watch(
            start_at_operation_time=start, show_expanded_events=True, max_await_time_ms=100
        )
        events = _collect(stream, lambda ev: ev.get("documentKey", {}).get("_id") == "end")
        # D14a: sharding a new collection creates it and its shard key index, then shards it.
        assert [e["operationType"] for e in events] == [
            "create",
            "createIndexes",
            "shardCollection",
        ] + ["insert"] * 501

    await sync(work)


async def test_move_range_cuts_its_range_out_of_a_chunk(cluster):
    def work():
        c = client(cluster.uri)
        start = c.admin.command("ping")["operationTime"]
        c.admin.command("shardCollection", "mr.c", key={"k": 1})
        c.mr.c.insert_many([{"_id": i, "k": i} for i in range(10)])
        sc = cluster.mongos.sharded["mr.c"]
        home = sc.chunks[0].shard
        other = next(sid for sid in sorted(cluster.replsets) if sid != home)
        c.admin.command("moveRange", "mr.c", toShard=other, min={"k": 3}, max={"k": 6})
        assert [(ch.min, ch.max, ch.shard) for ch in sc.chunks][1:] == [
            (3, 6, other),
            (6, sc.chunks[2].max, home),
        ]
        assert sorted(d["k"] for d in client(cluster.shard_uri(other)).mr.c.find()) == [3, 4, 5]
        for bad in (
            {"min": {"k": 7}, "max": {"k": 7}},
            {"min": {"k": 7}, "max": {"k": 3}},
            {"max": {"k": 3}},
        ):
            with pytest.raises(OperationFailure) as err:
                c.admin.command("moveRange", "mr.c", toShard=other, **bad)
            assert err.value.code == 72  # InvalidOptions
        c.admin.command(
            "moveRange", "mr.c", toShard=other, min={"k": 6}
        )  # less than a chunk size: all of it
        assert sorted(d["k"] for d in client(cluster.shard_uri(other)).mr.c.find()) == [
            3,
            4,
            5,
            6,
            7,
            8,
            9,
        ]
        c.admin.command(
            "moveRange", "mr.c", toShard=other, min={"k": MinKey()}
        )  # home's last chunk
        assert c.mr.c.count_documents({}) == 10 and {ch.shard for ch in sc.chunks} == {other}
        # The donor's notice, an event only with showSystemEvents and showExpandedEvents.
        spec = {"startAtOperationTime": start, "showExpandedEvents": True}
        end = c.admin.command("ping")["operationTime"]
        c.admin.command("appendOplogNote", data={"test": "end"})  # every shard past the moves
        for system, seen in ((False, []), (True, [{"shardId": home}])):
            cursor = c.mr.command(
                "aggregate",
                "c",
                cursor={},
                pipeline=[
                    {"$changeStream": {**spec, "showSystemEvents": system}},
                    {
                        "$match": {
                            "operationType": {
                                "$nin": ["insert", "create", "createIndexes", "shardCollection"]
                            }
                        }
                    },
                ],
            )["cursor"]
            batch = cursor["firstBatch"] + drain(
                c, cursor["id"], token_sort_key(high_water_mark(end)), db="mr", collection="c"
            )
            assert [dict(e["operationDescription"]) for e in batch] == seen
            assert all(
                e["operationType"] == "migrateLastChunkFromShard"
                and dict(e["ns"]) == {"db": "mr", "coll": "c"}
                for e in batch
            )

    await sync(work)


async def test_a_compound_shard_key_cuts_chunks_on_every_field(cluster):
    """Chunk bounds of a compound key hold a value for each field and compare field by field:
    documents with one `a` land on either side of a split at {a: 5, b: "m"}. A partial bound or
    query fails as the server's isShardKey and extractShardKeyFromQuery make it fail."""

    def work():
        c = client(cluster.uri)
        c.admin.command("shardCollection", "ck.c", key={"a": 1, "b": 1})
        c.admin.command("split", "ck.c", middle={"b": "m", "a": 5})  # fields in any order
        sc = cluster.mongos.sharded["ck.c"]
        home = sc.chunks[0].shard
        other = next(sid for sid in sorted(cluster.replsets) if sid != home)
        c.admin.command("moveChunk", "ck.c", find={"a": 5, "b": "z"}, to=other)
        c.ck.c.insert_many(
            [{"_id": i, "a": 5, "b": b} for i, b in enumerate("amqz")] + [{"_id": 9, "a": 6}]
        )
        assert sorted(d["b"] for d in client(cluster.shard_uri(home)).ck.c.find()) == ["a"]
        assert sorted(d.get("b", "-") for d in client(cluster.shard_uri(other)).ck.c.find()) == [
            "-",
            "m",
            "q",
            "z",
        ]
        chunks = list(
            c.config.chunks.find(
                {"uuid": c.config.collections.find_one({"_id": "ck.c"})["uuid"]}, sort=[("min", 1)]
            )
        )
        assert [(ch["min"], ch["max"], ch["shard"]) for ch in chunks] == [
            ({"a": MinKey(), "b": MinKey()}, {"a": 5, "b": "m"}, home),
            ({"a": 5, "b": "m"}, {"a": MaxKey(), "b": MaxKey()}, other),
        ]
        # Equality on every field targets one shard; on a prefix, every shard that may hold it.
        assert c.ck.c.find_one({"a": 5, "b": "a"})["_id"] == 0
        assert c.ck.c.count_documents({"a": 5}) == 4
        with pytest.raises(OperationFailure) as err:
            c.admin.command("split", "ck.c", middle={"a": 7})
        assert (
            err.value.details["errmsg"]
            == "new split key { a: 7 } is not valid for shard key pattern { a: 1, b: 1 }"
        )
        with pytest.raises(OperationFailure) as err:
            c.admin.command("split", "ck.c", middle={"a": 5, "b": "m"})
        assert err.value.details["errmsg"] == (
            'new split key { a: 5, b: "m" } is a boundary key of existing chunk '
            '[{ a: 5, b: "m" },{ a: MaxKey, b: MaxKey })'
        )
        with pytest.raises(OperationFailure) as err:
            c.admin.command("moveChunk", "ck.c", find={"a": 5}, to=home)
        assert (
            err.value.code == 656450
            and err.value.details["errmsg"] == "no shard key found in chunk query { a: 5 }"
        )

        # Hashed first: an empty collection starts with a chunk per shard, cut on the hash, the
        # other fields at MinKey. Hashed after a range prefix: one chunk.
        c.admin.command("shardCollection", "ck.h", key={"h": "hashed", "r": 1})
        mins = [ch.min for ch in cluster.mongos.sharded["ck.h"].chunks]
        assert len(mins) == len(cluster.replsets) and all(isinstance(m[1], MinKey) for m in mins)
        assert all(isinstance(m[0], Int64) for m in mins[1:])
        c.admin.command("shardCollection", "ck.r", key={"r": 1, "h": "hashed"})
        assert len(cluster.mongos.sharded["ck.r"].chunks) == 1

    await sync(work)


async def test_the_balancer_does_not_move_a_collection_a_transaction_holds_writes_to(cluster):
    def work():
        c = client(cluster.uri)
        admin = c.admin
        admin.command(
            "configureFailPoint",
            "overrideBalanceRoundInterval",
            mode="alwaysOn",
            data={"intervalMs": 20},
        )
        admin.command("balancerStop")
        admin.command("shardCollection", "tx.c", key={"k": 1})
        admin.command("configureCollectionBalancing", "tx.c", chunkSize=1)
        c.tx.c.insert_many([{"_id": i, "k": i, "pad": "x" * 10_000} for i in range(400)])
        with c.start_session() as s:
            s.start_transaction()
            c.tx.c.insert_one({"_id": "t", "k": -1}, session=s)
            admin.command("balancerStart")
            rounds = admin.command("balancerStatus")["numBalancerRounds"]
            wait_until(
                lambda: admin.command("balancerStatus")["numBalancerRounds"] > rounds + 3,
                timeout=10,
            )
            assert (
                len(cluster.mongos.sharded["tx.c"].chunks) == 1
            )  # held back while the transaction is open
            # So is an explicit moveChunk: its critical section waits for the transaction's locks.
            home = cluster.mongos.sharded["tx.c"].chunks[0].shard
            other = next(sid for sid in sorted(cluster.replsets) if sid != home)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                moving = pool.submit(admin.command, "moveChunk", "tx.c", find={"k": 0}, to=other)
                with pytest.raises(concurrent.futures.TimeoutError):
                    moving.result(timeout=0.5)
                s.commit_transaction()
                assert moving.result(timeout=10)["ok"] == 1
        wait_until(
            lambda: admin.command("balancerCollectionStatus", "tx.c")["balancerCompliant"],
            timeout=20,
        )
        assert len({ch.shard for ch in cluster.mongos.sharded["tx.c"].chunks}) > 1
        assert c.tx.c.count_documents({}) == 401

    await sync(work)


async def test_the_config_database_is_the_routing_metadata_and_its_settings_drive_the_balancer(
    cluster,
):
    """mongos serves the config server's catalog (simcluster/config_server.py): config.shards,
    databases, collections and chunks are the routing table in the server's shapes, with chunk
    versions that move as a split and a migration commit; config.settings is stored and the
    balancer obeys it; migrations land in config.changelog; the catalog refuses writes."""

    def work():
        c = client(cluster.uri)
        admin, config = c.admin, c.config
        admin.command(
            "configureFailPoint",
            "overrideBalanceRoundInterval",
            mode="alwaysOn",
            data={"intervalMs": 20},
        )
        admin.command("balancerStop")
        assert config.settings.find_one({"_id": "balancer"}) == {
            "_id": "balancer",
            "mode": "off",
            "stopped": True,
        }
        assert admin.command("balancerStatus")["mode"] == "off"
        admin.command("shardCollection", "cat.c", key={"k": 1})
        c.cat.c.insert_many(
            [{"_id": i, "k": i, "pad": "x" * 10_000} for i in range(600)]
        )  # 6 MB, one shard

        assert list(config.version.find_one()) == ["_id", "clusterId"]
        assert [s["_id"] for s in config.shards.find()] == sorted(cluster.replsets)
        assert config.shards.find_one({"_id": "shard0"}) == admin.command("listShards")["shards"][0]
        db_doc = config.databases.find_one({"_id": "cat"})
        assert (db_doc["primary"], list(db_doc["version"])) == (
            cluster.mongos.db_primary["cat"],
            ["uuid", "timestamp", "lastMod"],
        )
        coll = config.collections.find_one({"_id": "cat.c"})
        assert list(coll) == [
            "_id",
            "lastmodEpoch",
            "lastmod",
            "timestamp",
            "uuid",
            "key",
            "unique",
            "noBalance",
        ]
        uuid = next(c.cat.list_collections())["info"]["uuid"]
        assert (coll["key"], coll["unique"], coll["uuid"]) == ({"k": 1}, False, uuid)
        [chunk] = list(config.chunks.find({"uuid": coll["uuid"]}))
        assert (chunk["min"], chunk["max"], chunk["lastmod"]) == (
            {"k": MinKey()},
            {"k": MaxKey()},
            Timestamp(1, 0),
        )
        assert chunk["history"] == [{"validAfter": coll["timestamp"], "shard": chunk["shard"]}]

        # A split takes the next minor versions; a migration bumps the major, the donor's chunk too.
        home = chunk["shard"]
        other = next(sid for sid in sorted(cluster.replsets) if sid != home)
        admin.command("split", "cat.c", middle={"k": 100})
        admin.command("moveChunk", "cat.c", find={"k": 0}, to=other)
        chunks = [
            (ch["min"]["k"], ch["shard"], ch["lastmod"])
            for ch in config.chunks.find({"uuid": coll["uuid"]})
        ]
        assert chunks == [(MinKey(), other, Timestamp(2, 0)), (100, home, Timestamp(2, 1))]
        moved = config.chunks.find_one({"uuid": coll["uuid"], "shard": other})
        assert [h["shard"] for h in moved["history"]] == [other, home]
        assert moved["onCurrentShardSince"] == moved["history"][0]["validAfter"]
        [log] = list(config.changelog.find({"what": "moveChunk.from", "ns": "cat.c"}))
        assert log["details"] == {
            "min": {"k": MinKey()},
            "max": {"k": 100},
            "from": home,
            "to": other,
            "note": "success",
        }
        spread = {
            d["shardName"]: d["numOwnedDocuments"]
            for d in admin.aggregate(
                [{"$shardedDataDistribution": {}}, {"$match": {"ns": "cat.c"}}]
            ).next()["shards"]
        }
        # A shard that never held a chunk has no such collection, so no line (each shard reports
        # the collections it holds: $_internalAllCollectionStats under $shardedDataDistribution).
        assert spread == {home: 500, other: 100}
        with pytest.raises(OperationFailure) as err:
            c.cat.command("aggregate", 1, pipeline=[{"$shardedDataDistribution": {}}], cursor={})
        assert err.value.code == 73  # InvalidNamespace: the admin database only

        # The cluster's chunk size is config.settings' chunksize (MB); out of 1..1024 it is ignored.
        config.settings.update_one({"_id": "chunksize"}, {"$set": {"value": 2000}}, upsert=True)
        assert admin.command("balancerCollectionStatus", "cat.c")["chunkSize"] == 128.0
        config.settings.update_one({"_id": "chunksize"}, {"$set": {"value": 1}})
        status = admin.command("balancerCollectionStatus", "cat.c")
        assert (status["chunkSize"], status["balancerCompliant"]) == (1.0, False)
        assert (
            len(config.chunks.find({"uuid": coll["uuid"]}).distinct("shard")) == 2
        )  # stopped: nothing moves
        # A write to the settings document turns the balancer on, as balancerStart does.
        config.settings.update_one(
            {"_id": "balancer"}, {"$set": {"mode": "full", "stopped": False}}
        )
        wait_until(
            lambda: admin.command("balancerCollectionStatus", "cat.c")["balancerCompliant"],
            timeout=20,
        )
        assert len(config.chunks.find({"uuid": coll["uuid"]}).distinct("shard")) == len(
            cluster.replsets
        )
        assert (
            config.changelog.count_documents({"what": "moveChunk.from"})
            == cluster.mongos.balancer.migrations + 1
        )

        for write in (
            lambda: config.chunks.delete_many({}),
            lambda: config.shards.insert_one({"_id": "x"}),
            lambda: config.collections.update_one({"_id": "cat.c"}, {"$set": {"noBalance": True}}),
        ):
            with pytest.raises(OperationFailure) as err:
                write()
            assert err.value.code == 20  # IllegalOperation
        assert c.cat.c.count_documents({}) == 600
        assert "config" in c.list_database_names() and "cat" not in cluster.mongos.config.node.dbs

    await sync(work)


async def test_transactions_end_when_their_lifetime_expires_or_their_session_is_killed(cluster):
    """As on a server: an unprepared transaction older than transactionLifetimeLimitSeconds is
    aborted by a periodic pass, and killSessions through mongos ends the sessions' transactions on
    every shard; what they wrote is undone, and the next statement or the commit fails with
    NoSuchTransaction, a transient transaction error."""

    def work():
        c = client(cluster.uri)
        c.admin.command("shardCollection", "life.c", key={"_id": "hashed"})
        shards = [client(cluster.shard_uri(sid)).admin for sid in sorted(cluster.replsets)]
        assert (
            shards[0].command("getParameter", 1, transactionLifetimeLimitSeconds=1)[
                "transactionLifetimeLimitSeconds"
            ]
            == 60
        )
        with pytest.raises(OperationFailure) as err:
            shards[0].command("setParameter", 1, transactionLifetimeLimitSeconds=0)
        assert err.value.code == 2  # BadValue

        with c.start_session() as s:
            s.start_transaction()
            c.life.c.insert_many([{"_id": i} for i in range(20)], session=s)  # on every shard
            assert (
                c.life.c.count_documents({}) == 20
            )  # (simcluster applies a transaction's writes at once)
            c.admin.command("killSessions", [{"id": s.session_id["id"]}])
            assert c.life.c.count_documents({}) == 0
            with pytest.raises(OperationFailure) as err:
                s.commit_transaction()
            assert err.value.code == 251 and err.value.has_error_label("TransientTransactionError")

        for admin in shards:
            assert admin.command("setParameter", 1, transactionLifetimeLimitSeconds=1)["was"] == 60
        with c.start_session() as s:
            s.start_transaction()
            c.life.c.insert_many([{"_id": i} for i in range(20)], session=s)
            passes = [
                a.command("serverStatus")["metrics"]["abortExpiredTransactions"]["passes"]
                for a in shards
            ]
            # The third pass from now (one every half second) is a second or more after the start.
            wait_until(
                lambda: all(
                    a.command("serverStatus")["metrics"]["abortExpiredTransactions"]["passes"]
                    >= p + 3
                    for a, p in zip(shards, passes, strict=True)
                ),
                timeout=10,
            )
            with pytest.raises(OperationFailure) as err:
                c.life.c.insert_one({"_id": "late"}, session=s)
            assert err.value.code == 251
            with pytest.raises(OperationFailure) as err:
                s.commit_transaction()
            assert err.value.code == 251
        assert c.life.c.count_documents({}) == 0

    await sync(work)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--members", "0"], "argument --members: must be between 1 and 50, not 0"),
        (
            ["--port", "65535", "--shards", "2"],
            "--port 65535: the cluster's 3 processes take the ports from it",
        ),
        (["--user", "bob"], "--user bob: expected NAME:PASSWORD"),
        (
            ["--periodic-noop-s", "nan"],
            "argument --periodic-noop-s: must be at least 0.001, not nan",
        ),
    ],
)
def test_simcluster_command_refuses_bad_arguments_as_usage_errors(args, message):
    """Exit code 2 and the flag's name, as argparse reports its own errors; never a traceback from a
    cluster half started (members 0 was an IndexError, a port past 65535 wrapped around)."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "simcluster", *args], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


async def test_in_an_election_mongos_holds_a_write_for_the_new_primary_not_for_other_shards():
    """A shard without a primary: a write it must take waits for the election (as mongos waits up
    to defaultFindReplicaSetHostTimeoutMS) and then succeeds, also on a sharded collection, which
    every shard holds; a write to a collection of another shard's does not wait at all."""
    import time

    async with open_cluster(shards=2, members=3, election_timeout_s=1.0) as cluster:
        c = client(cluster.uri)
        on = {cluster.mongos.primary_of(db).set_name: db for db in ("e0", "e1")}

        def setup():
            c.admin.command("shardCollection", "e0.h", key={"_id": "hashed"})
            c[on["shard1"]].c.insert_one({"_id": 0})

        await sync(setup)
        rs0 = cluster.replsets["shard0"]
        rs0.stop_member(rs0.primary)

        def writes():
            began = time.monotonic()
            c[on["shard1"]].c.insert_one({"_id": 1})  # shard1 has its primary: no wait
            other = time.monotonic() - began
            c.e0.h.insert_one({"_id": 1})  # held until shard0 elects, then written
            c[on["shard0"]].c.insert_one({"_id": 1})
            return other

        assert await sync(writes) < 0.5
        assert rs0.primary_node is not None


async def exhaust_batches(host: str, port: int) -> tuple[list[list[int]], bool]:
    """Over a raw socket to `host`: find ks.c (batchSize 2), then one getMore with exhaustAllowed
    (batchSize 3), read to its last reply: each reply's batch (the documents' `i`), and whether the
    replies streamed. Streamed replies answer the one before and each has an id of its own."""
    stream = await trio.open_tcp_stream(host, port)
    framer = wire.MessageFramer()

    async def answer() -> wire.OpMsg:
        while (msg := framer.next_message()) is wire.NEED_DATA:
            framer.receive_data(await stream.receive_some(1 << 16))
        assert isinstance(msg, wire.OpMsg)
        return msg

    async with stream:
        await stream.send_all(
            wire.encode_op_msg(1, 0, bson.encode({"find": "c", "batchSize": 2, "$db": "ks"}))
        )
        cursor_id = bson.decode((await answer()).body)["cursor"]["id"]
        more = bson.encode({"getMore": cursor_id, "collection": "c", "batchSize": 3, "$db": "ks"})
        await stream.send_all(wire.encode_op_msg(2, 0, more, flags=wire.FLAG_EXHAUST_ALLOWED))
        batches, answers, ids, streamed = [], 2, set(), False
        while True:
            msg = await answer()
            assert msg.response_to == answers and msg.request_id not in ids | {0}
            cursor = bson.decode(msg.body)["cursor"]
            batches.append([doc["i"] for doc in cursor["nextBatch"]])
            if not msg.more_to_come:
                return batches, streamed
            assert cursor["id"] != 0  # moreToCome only while the cursor lives
            answers, streamed = msg.request_id, True
            ids.add(answers)


@pytest.mark.parametrize("version", ["7.0", "8.0"])
async def test_an_exhaust_get_more_streams_batches_from_mongod_and_from_mongos_since_7_1(version):
    """OP_MSG exhaust: a getMore with exhaustAllowed is answered batch after batch, unasked, each
    reply with moreToCome and answering the one before, until the cursor ends (a mongod since 4.2;
    a mongos since 7.1, SERVER-57297). An older mongos answers it once, as a plain getMore."""
    async with open_cluster(shards=1, version=version) as cluster:
        await sync(lambda: client(cluster.uri).ks.c.insert_many([{"i": i} for i in range(10)]))
        for node, streams in (
            (cluster.mongos.primary_of("ks"), True),
            (cluster.mongos, version == "8.0"),
        ):
            batches, streamed = await exhaust_batches(node.host, node.port)
            assert streamed == streams
            assert batches == ([[2, 3, 4], [5, 6, 7], [8, 9]] if streams else [[2, 3, 4]])


async def test_get_parameter_reports_enable_test_commands(cluster):
    """Drivers' test harnesses (pymongo's test/__init__.py ClientContext) read
    `getParameter: "*"`'s enableTestCommands before running anything; simcluster serves the test
    commands, as a server started with enableTestCommands=1 does."""

    def work():
        admin = client(cluster.uri).admin
        assert admin.command("getParameter", "*")["enableTestCommands"] is True
        reply = admin.command("getParameter", 1, enableTestCommands=1)
        assert reply["enableTestCommands"] is True and "featureCompatibilityVersion" not in reply

    await sync(work)


async def test_set_field_of_a_non_object_input_is_the_servers_error(cluster):
    """ExpressionSetField::evaluate (expression.cpp) uasserts 4161105 unless 'input' is an object
    (or nullish, which gives null); $unsetField is $setField with $$REMOVE."""

    def work():
        coll = client(cluster.uri).t.setfield
        coll.insert_one({"_id": 1, "arr": [1, 2]})
        for op in ("$setField", "$unsetField"):
            spec = {"field": "x", "input": "$arr", **({"value": 1} if op == "$setField" else {})}
            with pytest.raises(OperationFailure) as err:
                coll.update_one({"_id": 1}, [{"$set": {"y": {op: spec}}}])
            assert err.value.code == 4161105

    await sync(work)
