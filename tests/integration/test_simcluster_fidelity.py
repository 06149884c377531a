"""simcluster's oplog and commands as a real 7.0/8.0 server writes and answers them: the audit's
simulator-only items (fidelity-audit-2026-11-26.md, scope a). Each test names its item and the
server source or jstest that shows the real behaviour. Events are read from simcluster's mongos
(the independent reference stream); oplog entries straight from the shards."""

from __future__ import annotations

import datetime
import time
from typing import Any

import bson
import pytest
from bson import Int64, Timestamp
from pymongo import IndexModel
from pymongo.errors import OperationFailure

from simcluster import open_cluster
from tests.conftest import _close_all, client, sync

EXPANDED = {"show_expanded_events": True}


def _entries(node: Any, since: int = 0) -> list[dict[str, Any]]:
    return [bson.decode(raw) for raw in node.oplog.read_after(since, 1 << 30)]


def _events(c: Any, start: Any, db: str, **options: Any) -> list[dict[str, Any]]:
    """The database stream's events after `start` up to the insert of {_id: "end"} into db.end
    (db.end's own events left out)."""
    c[db].end.insert_one({"_id": "end"})
    c.admin.command("appendOplogNote", data={"end": 1})  # every shard past the marker: no idle wait
    start = Timestamp(start.time, start.inc + 1)  # after the last write before the case's
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    with c[db].watch(start_at_operation_time=start, **EXPANDED, **options) as stream:
        while time.monotonic() < deadline:
            ev = stream.try_next()
            if ev is None:
                continue
            if ev["ns"].get("coll") == "end":
                if ev["operationType"] == "insert":
                    return out
                continue
            out.append(ev)
    raise AssertionError(f"no end marker; got {out}")


def _kinds(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["operationType"], e["ns"].get("coll")) for e in events]


async def test_d1b_view_coll_mod_is_a_replacement_of_its_system_views_document(cluster):
    """D1b: collMod on a view rewrites its system.views document (ViewCatalog::modifyView), so the
    oplog holds `u` on <db>.system.views and the event comes from the view transform
    (change_stream_event_transform.cpp, ChangeStreamViewDefinitionEventTransformation, kUpdate:
    operationDescription = o minus _id; no collectionUUID, no stateBeforeChange);
    jstests/change_streams/ddl_view_events.js "Test 'collMod' command on views"."""

    def work():
        c = client(cluster.uri)
        start = c.admin.command("ping")["operationTime"]
        c.vdb.create_collection("base")
        c.vdb.command({"create": "v", "viewOn": "base", "pipeline": [{"$match": {"a": 1}}]})
        c.vdb.command({"collMod": "v", "viewOn": "base", "pipeline": [{"$match": {"a": 2}}]})
        return _events(c, start, "vdb")

    events = await sync(work)
    node = cluster.mongos.primary_of("vdb")
    views = node.coll("vdb.system.views")
    update = [e for e in _entries(node) if e["op"] == "u" and e["ns"] == "vdb.system.views"]
    assert [(e["o"], e["o2"], e["ui"].as_uuid()) for e in update] == [
        (
            {"_id": "vdb.v", "viewOn": "base", "pipeline": [{"$match": {"a": 2}}]},
            {"_id": "vdb.v"},
            views.uuid,
        )
    ]
    assert not [e for e in _entries(node) if e["op"] == "c" and "collMod" in e["o"]]
    modify = next(e for e in events if e["operationType"] == "modify")
    assert modify["operationDescription"] == {"viewOn": "base", "pipeline": [{"$match": {"a": 2}}]}
    assert "collectionUUID" not in modify and "stateBeforeChange" not in modify
    assert _kinds(events) == [
        ("create", "base"),
        ("create", "v"),
        ("modify", "v"),
    ]  # system.views filtered


async def test_d6b_ddl_inside_a_transaction_is_in_its_apply_ops(cluster):
    """D6b: a createIndex in a transaction on a collection that does not exist yet logs create
    and createIndexes inside the transaction's applyOps, so every event has the commit's
    clusterTime, lsid and txnNumber (jstests/change_streams/ddl_create_index_txn.js)."""

    def work():
        c = client(cluster.uri)
        start = c.admin.command("ping")["operationTime"]
        with c.start_session() as s, s.start_transaction():
            c.tdb.fresh.create_index("unused", session=s)
            c.tdb.fresh.insert_one({"_id": 1}, session=s)
        return _events(c, start, "tdb")

    events = await sync(work)
    assert _kinds(events) == [("create", "fresh"), ("createIndexes", "fresh"), ("insert", "fresh")]
    assert len({e["clusterTime"] for e in events}) == 1
    assert all("lsid" in e and "txnNumber" in e for e in events)
    assert events[1]["operationDescription"] == {
        "indexes": [{"v": 2, "key": {"unused": 1}, "name": "unused_1"}]
    }
    node = cluster.mongos.primary_of("tdb")
    apply_ops = [e for e in _entries(node) if "applyOps" in e.get("o", {})]
    assert [list(op["o"])[0] for op in apply_ops[-1]["o"]["applyOps"]] == [
        "create",
        "createIndexes",
        "_id",
    ]
    assert not [
        e
        for e in _entries(node)
        if e["op"] == "c" and "create" in e["o"] and e["o"]["create"] == "fresh"
    ]  # never outside the applyOps


async def test_d12_a_sharded_drop_is_one_visible_drop(cluster):
    """D12: 7.0's DropCollectionCoordinator sends the drop to the other shards with fromMigrate
    and to the primary shard without it (sendDropCollectionParticipantCommandToShards(...,
    true /* fromMigrate */)); change streams hide fromMigrate (buildNotFromMigrateFilter)."""

    def work():
        c = client(cluster.uri)
        c.admin.command("enableSharding", "ddb")
        c.admin.command("shardCollection", "ddb.sh", key={"_id": "hashed"})
        start = c.admin.command("ping")["operationTime"]
        c.ddb.sh.drop()
        return _events(c, start, "ddb")

    events = await sync(work)
    assert _kinds(events) == [("drop", "sh")]
    primary = cluster.mongos.primary_of("ddb")
    for node in cluster.mongos.shards.values():
        drops = [e for e in _entries(node) if e["op"] == "c" and e["o"].get("drop") == "sh"]
        assert [bool(e.get("fromMigrate")) for e in drops] == [node is not primary], node.set_name


async def test_d13_index_build_on_a_non_empty_collection_is_one_commit(cluster):
    """D13: indexes built on a collection with documents are logged as startIndexBuild then one
    commitIndexBuild holding all of them; the event is one createIndexes with every index
    (IndexBuildsCoordinator; change_stream_event_transform.cpp maps commitIndexBuild to
    {indexes: o.indexes}; the real token research/real-resume-tokens.json #14)."""

    def work():
        c = client(cluster.uri)
        c.idb.c.insert_one({"_id": 1, "a": 1, "b": 1})
        start = c.admin.command("ping")["operationTime"]
        c.idb.c.create_indexes([IndexModel("a"), IndexModel("b")])
        return _events(c, start, "idb")

    events = await sync(work)
    assert _kinds(events) == [("createIndexes", "c")]
    assert events[0]["operationDescription"] == {
        "indexes": [
            {"v": 2, "key": {"a": 1}, "name": "a_1"},
            {"v": 2, "key": {"b": 1}, "name": "b_1"},
        ]
    }
    node = cluster.mongos.primary_of("idb")
    builds = [
        e["o"]
        for e in _entries(node)
        if e["op"] == "c" and ("startIndexBuild" in e["o"] or "commitIndexBuild" in e["o"])
    ]
    assert [list(o) for o in builds] == [
        ["startIndexBuild", "indexBuildUUID", "indexes"],
        ["commitIndexBuild", "indexBuildUUID", "indexes"],
    ]
    assert builds[0]["indexBuildUUID"] == builds[1]["indexBuildUUID"]


async def test_d14_shard_collection_creates_the_key_index_and_logs_its_options(cluster):
    """D14a: sharding a new collection creates it, then its shard key index (createIndexes), then
    shards it (the sharding change-stream DDL test library: "When sharding a non-existent
    collection, MongoDB implicitly: 1. Creates the collection 2. Creates the shard key index 3.
    Shards the collection"). D14b: the shardCollection noop's o2 holds numInitialChunks and
    collation as given (the shardCollection events jstest: numInitialChunks NumberLong(10),
    collation {locale: "simple"})."""

    def work():
        c = client(cluster.uri)
        c.admin.command("enableSharding", "sdb")
        start = c.admin.command("ping")["operationTime"]
        c.admin.command(
            "shardCollection",
            "sdb.c",
            key={"x": "hashed"},
            numInitialChunks=10,
            collation={"locale": "simple"},
        )
        return _events(c, start, "sdb")

    events = await sync(work)
    assert _kinds(events) == [("create", "c"), ("createIndexes", "c"), ("shardCollection", "c")]
    assert events[1]["operationDescription"] == {
        "indexes": [{"v": 2, "key": {"x": "hashed"}, "name": "x_hashed"}]
    }
    desc = events[2]["operationDescription"]
    assert desc == {
        "shardKey": {"x": "hashed"},
        "unique": False,
        "numInitialChunks": 10,
        "presplitHashedZones": False,
        "collation": {"locale": "simple"},
    }
    assert type(desc["numInitialChunks"]) is Int64


async def test_d15_state_before_change_starts_with_the_uuid(cluster):
    """D15: collMod's o2 collectionOptions_old is CollectionOptions::appendBSON's output, uuid first
    (collection_options.cpp); jstests/change_streams/ddl_coll_mod_event.js expects
    stateBeforeChange {collectionOptions: {uuid, ...}}."""

    def work():
        c = client(cluster.uri)
        c.mdb.create_collection("c", validator={"a": 1}, validationAction="warn")
        start = c.admin.command("ping")["operationTime"]
        c.mdb.command({"collMod": "c", "validationLevel": "moderate"})
        return _events(c, start, "mdb")

    events = await sync(work)
    uuid = cluster.mongos.primary_of("mdb").coll("mdb.c").uuid
    options = events[0]["stateBeforeChange"]["collectionOptions"]
    assert list(options) == ["uuid", "validator", "validationAction"]
    assert options["uuid"].as_uuid() == uuid


async def test_d16_create_options_as_the_catalog_stores_them(cluster):
    """D16: a create entry holds the options as CollectionOptions::appendBSON orders and types
    them (collection_options.cpp): capped size rounded up to 256 (adjustCappedSize) as an int32,
    a clustered index with v:2, expireAfterSeconds a long and no idIndex, the collation expanded
    with the _id index inheriting it, and no idIndex for v:1 (op_observer_impl.cpp: "Include the
    full _id index spec in the oplog for index versions >= 2"); jstests/change_streams/
    ddl_create_event.js. Only locales whose defaults are ICU's root ones are expanded."""

    def work():
        c = client(cluster.uri)
        db = c.cdb
        db.command(
            {
                "create": "capped",
                "validationAction": "warn",
                "validator": {"a": 1},
                "capped": True,
                "size": 1000.0,
            }
        )
        db.command(
            {
                "create": "clustered",
                "clusteredIndex": {"key": {"_id": 1}, "unique": True, "name": "n"},
                "expireAfterSeconds": 10,
            }
        )
        db.command({"create": "fr", "collation": {"locale": "fr", "strength": 1}})
        db.command({"create": "v1", "idIndex": {"v": 1, "key": {"_id": 1}, "name": "x"}})
        db.command({"create": "other", "collation": {"locale": "fr_CA"}})

    await sync(work)
    creates = {
        e["o"]["create"]: e["o"]
        for e in _entries(cluster.mongos.primary_of("cdb"))
        if e["op"] == "c" and "create" in e["o"]
    }
    id_index = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
    assert list(creates["capped"].items()) == [
        ("create", "capped"),
        ("capped", True),
        ("size", 1024),
        ("validator", {"a": 1}),
        ("validationAction", "warn"),
        ("idIndex", id_index),
    ]
    assert type(creates["capped"]["size"]) is int
    assert creates["clustered"] == {
        "create": "clustered",
        "clusteredIndex": {"v": 2, "key": {"_id": 1}, "name": "n", "unique": True},
        "expireAfterSeconds": 10,
    }
    assert type(creates["clustered"]["expireAfterSeconds"]) is Int64
    collation = {
        "locale": "fr",
        "caseLevel": False,
        "caseFirst": "off",
        "strength": 1,
        "numericOrdering": False,
        "alternate": "non-ignorable",
        "maxVariable": "punct",
        "normalization": False,
        "backwards": False,
        "version": "57.1",
    }
    assert creates["fr"] == {
        "create": "fr",
        "collation": collation,
        "idIndex": {**id_index, "collation": collation},
    }
    assert creates["v1"] == {"create": "v1"}
    assert creates["other"]["collation"] == {
        "locale": "fr_CA"
    }  # not expanded: locale-tailored defaults


async def test_d17_index_specs_in_the_catalog_order(cluster):
    """D17: IndexCatalogImpl::_fixIndexSpec (index_catalog_impl.cpp) rebuilds a spec as v, unique?,
    hidden?, prepareUnique?, key, name, rest; createIndexes `o` and dropIndexes `o2` both show it
    (the real dropIndexes token research #15 decodes to {v, key, name})."""

    def work():
        c = client(cluster.uri)
        c.xdb.command(
            {
                "createIndexes": "c",
                "indexes": [
                    {"name": "a_1", "sparse": True, "key": {"a": 1}, "hidden": True, "unique": True}
                ],
            }
        )
        c.xdb.c.drop_index("a_1")

    await sync(work)
    entries = [e for e in _entries(cluster.mongos.primary_of("xdb")) if e["op"] == "c"]
    created = next(e["o"] for e in entries if "createIndexes" in e["o"])
    dropped = next(e["o2"] for e in entries if "dropIndexes" in e["o"])
    assert list(created) == ["createIndexes", "v", "unique", "hidden", "key", "name", "sparse"]
    assert list(dropped) == ["v", "unique", "hidden", "key", "name", "sparse"]


async def test_d18_a_time_series_collection_is_a_view_on_its_buckets(cluster):
    """D18: 7.0/8.0 make a time-series collection as the clustered system.buckets.<name> plus a
    view on it (timeseries::createCollection); the stream shows only the view's create, from
    system.views, without collectionUUID (ddl_view_events.js timeseries section; the
    system.buckets create is filtered, change_stream_filter_helpers.cpp kRegexAllCollections)."""

    def work():
        c = client(cluster.uri)
        start = c.admin.command("ping")["operationTime"]
        c.tsdb.command({"create": "ts", "timeseries": {"timeField": "time"}})
        # Its writes go to the buckets collection, which streams never show (system.*).
        c.tsdb.ts.insert_one({"_id": 1, "time": datetime.datetime(2026, 1, 1)})
        assert [d["_id"] for d in c.tsdb.ts.find()] == [1]
        infos = {i["name"]: i for i in c.tsdb.list_collections()}
        assert infos["ts"]["type"] == "timeseries" and "timeseries" in infos["ts"]["options"]
        return _events(c, start, "tsdb")

    events = await sync(work)
    assert _kinds(events) == [("create", "ts")]
    assert events[0]["operationDescription"] == {
        "viewOn": "system.buckets.ts",
        "pipeline": [
            {"$_internalUnpackBucket": {"timeField": "time", "bucketMaxSpanSeconds": 3600}}
        ],
    }
    assert "collectionUUID" not in events[0]
    node = cluster.mongos.primary_of("tsdb")
    buckets = next(
        e["o"]
        for e in _entries(node)
        if e["op"] == "c" and e["o"].get("create") == "system.buckets.ts"
    )
    assert buckets["clusteredIndex"] is True and buckets["timeseries"]["timeField"] == "time"


async def test_d19g_history_lost_at_open_carries_the_non_resumable_label():
    """D19g: ErrorLabelBuilder::build adds NonResumableChangeStreamError to any reply whose code is
    in that category, the opening aggregate's included (error_labels.cpp)."""
    async with open_cluster(shards=1, oplog_bytes=40_000) as cluster:

        def work():
            c = client(cluster.uri)
            start = c.admin.command("ping")["operationTime"]
            for i in range(20):
                c.t.c.insert_many([{"_id": i * 100 + j, "pad": "x" * 200} for j in range(100)])
            with pytest.raises(OperationFailure) as info:
                c.t.c.watch(start_at_operation_time=start).try_next()
            assert info.value.code == 286
            assert "NonResumableChangeStreamError" in info.value.details.get("errorLabels", [])

        try:
            await sync(work)
        finally:
            await sync(_close_all)


async def test_refine_and_reshard_collection_log_their_noops():
    """reshardCollection and refineCollectionShardKey as the 7.0 coordinators log them, on the
    primary shard with the collection's ns and ui: refine_collection_shard_key_coordinator.cpp
    (o2 {refineCollectionShardKey, shardKey, oldShardKey}) and reshard_collection_coordinator.cpp
    (o2 {reshardCollection, reshardUUID, shardKey, oldShardKey, unique, numInitialChunks?,
    collation?}); 8.0 adds provenance. The events: change_stream_event_transform.cpp kNoop,
    operationDescription = o2 minus its first field."""
    async with open_cluster(shards=2, version="8.0") as cluster:

        def work():
            c = client(cluster.uri)
            c.admin.command("enableSharding", "rdb")
            c.admin.command("shardCollection", "rdb.c", key={"k": 1})
            c.rdb.c.insert_many([{"_id": i, "k": i, "s": -i} for i in range(20)])
            c.rdb.c.create_index([("k", 1), ("s", 1)])
            before = cluster.mongos.sharded["rdb.c"].uuid
            start = c.admin.command("ping")["operationTime"]
            c.admin.command("refineCollectionShardKey", "rdb.c", key={"k": 1, "s": 1})
            c.admin.command("reshardCollection", "rdb.c", key={"s": 1}, numInitialChunks=2)
            assert c.rdb.c.count_documents({}) == 20 and c.rdb.c.find_one({"s": -3})["_id"] == 3
            with pytest.raises(OperationFailure) as info:
                c.admin.command("refineCollectionShardKey", "rdb.c", key={"k": 1})
            assert info.value.code == 72  # InvalidOptions: not an extension of {s: 1}
            c.rdb.c.insert_one({"_id": "after", "k": 0, "s": 0})
            return before, _events(c, start, "rdb")

        try:
            before, events = await sync(work)
        finally:
            await sync(_close_all)
        # The resharded collection is built as a system.resharding.* collection and renamed
        # with fromMigrate: nothing of it shows, but the noop.
        assert [e["operationType"] for e in events] == [
            "refineCollectionShardKey",
            "reshardCollection",
            "insert",
        ]
        assert events[0]["operationDescription"] == {
            "shardKey": {"k": 1, "s": 1},
            "oldShardKey": {"k": 1},
        }
        desc = events[1]["operationDescription"]
        assert list(desc) == [
            "reshardUUID",
            "shardKey",
            "oldShardKey",
            "unique",
            "numInitialChunks",
            "provenance",
        ]
        assert desc["shardKey"] == {"s": 1} and desc["oldShardKey"] == {"k": 1, "s": 1}
        # The noops carry the collection's UUID before resharding; the new one is the resharding
        # UUID, which later events carry.
        after = cluster.mongos.sharded["rdb.c"].uuid
        assert [e["collectionUUID"].as_uuid() for e in events] == [before, before, after]
        assert desc["reshardUUID"].as_uuid() == after != before


def _fidelity_workload(c: Any) -> None:
    """Every entry kind the items above make simcluster write."""
    c.admin.command("enableSharding", "wk")
    c.wk.create_collection("base")
    c.wk.command({"create": "v", "viewOn": "base", "pipeline": [{"$match": {"a": 1}}]})
    c.wk.command({"collMod": "v", "viewOn": "base", "pipeline": [{"$match": {"a": 2}}]})
    with c.start_session() as s, s.start_transaction():
        c.wk.fresh.create_index("unused", session=s)
        c.wk.fresh.insert_one({"_id": 1}, session=s)
    c.admin.command("shardCollection", "wk.sh", key={"_id": "hashed"}, numInitialChunks=6)
    c.wk.sh.insert_many([{"_id": i, "a": i, "b": i} for i in range(10)])
    c.wk.sh.create_indexes([IndexModel("a"), IndexModel("b")])
    c.wk.command({"collMod": "sh", "index": {"name": "a_1", "hidden": True}})
    c.wk.sh.drop_index("a_1")
    c.wk.sh.drop()
    c.wk.command({"create": "capped", "capped": True, "size": 1000.0, "validator": {"a": 1}})
    c.wk.command({"create": "fr", "collation": {"locale": "fr"}})
    c.wk.command({"create": "ts", "timeseries": {"timeField": "time"}})
    c.admin.command("shardCollection", "wk.r", key={"k": 1})
    c.wk.r.insert_many([{"_id": i, "k": i, "s": -i} for i in range(10)])
    c.wk.r.create_index([("k", 1), ("s", 1)])
    c.admin.command("refineCollectionShardKey", "wk.r", key={"k": 1, "s": 1})
    c.admin.command("reshardCollection", "wk.r", key={"s": 1})
    c.wk.v.drop()
    c.wk.marker.insert_one({"_id": "end", "marker": True})


@pytest.mark.parametrize("version", ["7.0", "8.0"])
async def test_the_engine_equals_the_reference_on_these_entries(version):
    """The proxy's accelerated watch() delivers, byte for byte, what simcluster's mongos delivers
    on all the entries above (cluster-wide, showExpandedEvents)."""
    from tests.integration.test_accelerate import _clients, _collect, _is_marker, accelerated
    from tests.integration.test_engine import drain, end_point, key, native_stream

    async with accelerated(shards=2, version=version) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            _fidelity_workload(direct)
            want = _collect(
                direct.watch(start_at_operation_time=start, max_await_time_ms=200, **EXPANDED),
                _is_marker,
            )
            got = _collect(
                proxied.watch(start_at_operation_time=start, max_await_time_ms=200, **EXPANDED),
                _is_marker,
            )
            assert {
                "modify",
                "createIndexes",
                "dropIndexes",
                "drop",
                "shardCollection",
                "create",
                "refineCollectionShardKey",
                "reshardCollection",
            } <= {e["operationType"] for e in want}
            assert [bson.encode(e) for e in got] == [bson.encode(e) for e in want]
            # parallelChangeStream's buckets: their union, in token order, is mongos's stream.
            opened = proxied.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 3,
                    "showExpandedEvents": True,
                    "startAtOperationTime": start,
                }
            )
            end = end_point(proxied)
            union = {
                key(e["_id"]): e
                for cur in opened["cursors"]
                for e in drain(proxied, cur["id"], end)
            }
            native = native_stream(direct, start, end)
            assert [union[k].raw for k in sorted(union)] == [e.raw for e in native]

        await sync(work)


async def test_indexes_in_a_transaction_only_on_a_collection_it_created(cluster):
    """create_indexes.cpp: "Cannot create new indexes on existing collection ... in a
    multi-document transaction." (OperationNotSupportedInTransaction, 263); the index of a
    collection the transaction created is fine (ddl_create_index_txn.js)."""

    def work():
        c = client(cluster.uri)
        c.odb.old.insert_one({"_id": 1})
        with c.start_session() as s:
            s.start_transaction()
            with pytest.raises(OperationFailure) as info:
                c.odb.old.create_index("a", session=s)
            assert info.value.code == 263
            s.abort_transaction()

    await sync(work)


async def test_secondaries_apply_these_entries_to_the_same_catalog():
    """A secondary applying the entries above (system.views writes, index builds, DDL inside
    applyOps, time-series, resharding's rename) ends with the primary's catalog and documents."""
    from tests.integration.test_replication import _settled

    async with open_cluster(shards=2, members=2) as cluster:
        await sync(lambda: _fidelity_workload(client(cluster.uri)))
        for rs in cluster.replsets.values():
            await _settled(rs)

            def catalog(node: Any) -> dict[str, Any]:
                return {
                    (db, name): (
                        coll.uuid,
                        coll.options,
                        [ix.spec for ix in coll.indexes.values()],
                        sorted(bson.encode(d) for d in coll.docs.values()),
                    )
                    for db, colls in node.dbs.items()
                    for name, coll in colls.items()
                }

            for member in rs.members[1:]:
                assert catalog(member) == catalog(rs.primary), member.address
        await sync(_close_all)
