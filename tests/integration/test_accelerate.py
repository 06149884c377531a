"""Change stream acceleration: an unmodified `watch()` through the proxy, served by the engine,
yields the events and tokens mongos yields; what the engine cannot reproduce passes through."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import bson
import pytest
import trio
from bson import Decimal128, Int64
from pymongo.errors import DuplicateKeyError, OperationFailure

from buckets.shaping import SHAPE_RUN_EVENTS
from mongoformats.resume_token import decode_token
from simcluster import open_cluster
from tests.conftest import _close_all, client, sync
from tests.unit.test_change_stages import DEBEZIUM, DEBEZIUM_SKIP
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig


def _collect(stream: Any, until: Any, timeout: float = 120) -> list[dict[str, Any]]:
    """Events up to and including the first one for which `until(event)` holds."""
    out = []
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, (
            f"no closing event in {timeout} s ({len(out)} events read)"
        )
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
            if until(ev):
                stream.close()
                return out


def _is_marker(ev: dict[str, Any]) -> bool:
    return ev["operationType"] == "insert" and ev["fullDocument"].get("marker") is True


@contextlib.asynccontextmanager
async def accelerated(
    shards: int, version: str = "7.0", reader_processes: int = 0
) -> AsyncIterator[tuple[Any, Any]]:
    """A cluster (short periodic noops, so native streams move on) and a proxy with acceleration
    on."""
    async with (
        open_cluster(shards=shards, periodic_noop_s=0.2, version=version) as cluster,
        trio.open_nursery() as nursery,
    ):
        server = await nursery.start(
            serve_proxy,
            ProxyConfig(
                upstream=cluster.uri,
                listen_port=0,
                accelerate_change_streams=True,
                reader_processes=reader_processes,
            ),
        )
        yield cluster, server
        await sync(_close_all)  # while the proxy still answers endSessions
        nursery.cancel_scope.cancel()


def _clients(cluster: Any, server: Any) -> tuple[Any, Any, Any]:
    """A client of mongos, one of the proxy, and the cluster time now (where streams start)."""
    direct = client(cluster.uri)
    return (
        direct,
        client(f"mongodb://127.0.0.1:{server.port}/"),
        direct.admin.command("ping")["operationTime"],
    )


async def test_watch_through_the_accelerated_proxy_equals_mongos():
    async with accelerated(shards=3) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            direct.admin.command("shardCollection", "acc.h", key={"_id": "hashed"})
            direct.acc.h.insert_many([{"_id": i, "v": i} for i in range(60)])
            direct.acc.h.update_many({"v": {"$lt": 10}}, {"$set": {"low": True}})
            direct.acc.h.update_one(
                {"v": 55}, {"$set": {"gone": "soon"}}
            )  # its lookup finds nothing
            direct.acc.other.insert_many([{"_id": i} for i in range(20)])
            direct.acc.h.delete_many({"v": {"$gte": 50}})
            direct.acc.other.drop()
            direct.acc.h.insert_one({"_id": "end", "marker": True})
            for name, target in (
                ("collection", lambda c: c.acc.h),
                ("database", lambda c: c.acc),
                ("cluster", lambda c: c),
            ):
                want = _collect(
                    target(direct).watch(start_at_operation_time=start, max_await_time_ms=200),
                    _is_marker,
                )
                got = _collect(
                    target(proxied).watch(start_at_operation_time=start, max_await_time_ms=200),
                    _is_marker,
                )
                assert len(want) > 60
                assert [bson.encode(e) for e in got] == [bson.encode(e) for e in want], name
            # A collection stream ends with the drop of its collection and an invalidate, through
            # the engine too.
            ev = _collect(
                proxied.acc.other.watch(start_at_operation_time=start, max_await_time_ms=200),
                lambda e: e["operationType"] == "invalidate",
            )
            assert [e["operationType"] for e in ev[-2:]] == ["drop", "invalidate"] and len(ev) == 22
            # fullDocument: updateLookup is accelerated too: the engine looks the documents up.
            for name, target in (("collection", lambda c: c.acc.h), ("cluster", lambda c: c)):
                want = _collect(
                    target(direct).watch(
                        start_at_operation_time=start,
                        max_await_time_ms=200,
                        full_document="updateLookup",
                    ),
                    _is_marker,
                )
                stream = target(proxied).watch(
                    start_at_operation_time=start,
                    max_await_time_ms=200,
                    full_document="updateLookup",
                )
                assert (
                    proxied.admin.command("parallelChangeStreamStatus")["cursors"] == 1
                )  # the engine's
                got = _collect(stream, _is_marker)
                assert [bson.encode(e) for e in got] == [bson.encode(e) for e in want], name
            # Other stages, and a $match that tests the looked-up document: still accelerated.
            pipelines = (
                [
                    {"$project": {"operationType": 1, "fullDocument": 1, "ns": 1}},
                    {"$addFields": {"k": 1}},
                ],
                [
                    {"$set": {"coll": "$ns.coll"}},
                    {"$match": {"fullDocument.v": {"$ne": 3}}},
                    {"$unset": "wallTime"},
                ],
            )
            for pipeline in pipelines:
                want = _collect(
                    direct.acc.h.watch(
                        pipeline,
                        start_at_operation_time=start,
                        max_await_time_ms=200,
                        full_document="updateLookup",
                    ),
                    _is_marker,
                )
                stream = proxied.acc.h.watch(
                    pipeline,
                    start_at_operation_time=start,
                    max_await_time_ms=200,
                    full_document="updateLookup",
                )
                assert (
                    proxied.admin.command("parallelChangeStreamStatus")["cursors"] == 1
                )  # the engine's
                shaped = _collect(stream, _is_marker)
                assert [bson.encode(e) for e in shaped] == [bson.encode(e) for e in want], pipeline
            updates = [e for e in got if e["operationType"] == "update"]
            assert len(updates) == 11 and sum(u["fullDocument"] is None for u in updates) == 1
            assert all(
                u["fullDocument"]["low"] is True for u in updates if u["fullDocument"] is not None
            )

        await sync(work)


async def test_update_lookup_tells_documents_apart_by_the_whole_document_key():
    """`_id` is unique only on each shard: two documents with one `_id` on two shards differ by
    their shard key, and the engine's updateLookup finds each its own document, as mongos does.
    Values an index holds equal (14, 14.0, NumberLong 14) are one `_id`, in simcluster as on a
    server."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct = client(cluster.uri)
            proxied = client(f"mongodb://127.0.0.1:{server.port}/")
            direct.admin.command("shardCollection", "acc.r", key={"k": 1})
            direct.admin.command("split", "acc.r", middle={"k": 500})
            shards = sorted(s["_id"] for s in direct.admin.command("listShards")["shards"])
            direct.admin.command("moveChunk", "acc.r", find={"k": 1}, to=shards[0])
            direct.admin.command("moveChunk", "acc.r", find={"k": 900}, to=shards[1])
            start = direct.admin.command("ping")["operationTime"]
            direct.acc.r.insert_many([{"_id": 1, "k": 1}, {"_id": 1, "k": 900}])
            direct.acc.r.update_many({"_id": 1}, {"$set": {"seen": True}})
            direct.acc.r.insert_one({"_id": "end", "k": 2, "marker": True})
            want = _collect(
                direct.acc.r.watch(
                    start_at_operation_time=start,
                    max_await_time_ms=200,
                    full_document="updateLookup",
                ),
                _is_marker,
            )
            got = _collect(
                proxied.acc.r.watch(
                    start_at_operation_time=start,
                    max_await_time_ms=200,
                    full_document="updateLookup",
                ),
                _is_marker,
            )
            assert [bson.encode(e) for e in got] == [bson.encode(e) for e in want]
            assert sorted(
                (e["documentKey"]["k"], e["fullDocument"]["k"])
                for e in got
                if e["operationType"] == "update"
            ) == [(1, 1), (900, 900)]
            direct.admin.command("shardCollection", "acc.h", key={"_id": "hashed"})
            for coll in (direct.acc.plain, direct.acc.h):
                coll.insert_one({"_id": 14})
                for same in (14.0, Int64(14), Decimal128("14")):
                    with pytest.raises(DuplicateKeyError):
                        coll.insert_one({"_id": same})
                assert coll.count_documents({}) == 1

        await sync(work)


@pytest.mark.parametrize("version", ["5.0", "6.0"])
async def test_servers_before_6_1_keep_their_own_streams(version):
    """5.0 and 6.0 servers write v1 resume tokens, the engine v2: their watch() passes through."""
    async with accelerated(shards=2, version=version) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            direct.old.c.insert_many(
                [{"_id": i} for i in range(5)] + [{"_id": "end", "marker": True}]
            )
            want = _collect(
                direct.old.c.watch(start_at_operation_time=start, max_await_time_ms=200), _is_marker
            )
            got = _collect(
                proxied.old.c.watch(start_at_operation_time=start, max_await_time_ms=200),
                _is_marker,
            )
            assert [bson.encode(e) for e in got] == [bson.encode(e) for e in want] and len(got) == 6
            assert decode_token(got[0]["_id"]).version == 1
            watches = proxied.admin.command("parallelChangeStreamStatus")["watches"]
            assert watches == {"accelerated": 0, "passedThrough": 1}

        await sync(work)


async def test_stages_the_engine_does_not_evaluate_go_to_mongos():
    """A watch() whose stages use what mongoformats.change_stages does not evaluate (an operator
    expression in $expr or a projection, a $replaceRoot that may not make a document) is mongos's:
    the consumer gets mongos's own answer, here simcluster's, which evaluates no more than the
    engine does."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            for pipeline in (
                [{"$match": {"$expr": {"$eq": [{"$toLower": "$operationType"}, "insert"]}}}],
                [{"$replaceRoot": {"newRoot": "$fullDocument"}}],
                [{"$project": {"x": {"$toUpper": "$ns.db"}}}],
            ):
                errors = []
                for c in (direct, proxied):
                    with pytest.raises(OperationFailure) as info:
                        c.pass_.c.watch(pipeline, start_at_operation_time=start).try_next()
                    errors.append((info.value.code, str(info.value)))
                assert errors[0] == errors[1] and errors[0][0] == 238, errors
            # A collation changes what the stages match, an explain answers no cursor. (pymongo's
            # watch() drops its collation argument; the Java driver, Debezium's, sends it.)
            for c in (direct, proxied):
                for extra in ({"collation": {"locale": "en", "strength": 2}}, {"explain": True}):
                    with pytest.raises(OperationFailure) as info:
                        c.pass_.command(
                            "aggregate", "c", pipeline=[{"$changeStream": {}}], cursor={}, **extra
                        )
                    assert info.value.code == 238, extra
            opened = proxied.pass_.command(
                "aggregate",
                "c",
                pipeline=[{"$changeStream": {}}],
                cursor={},
                collation={"locale": "simple"},
            )  # the default, binary: accelerated
            proxied.pass_.command("killCursors", "c", cursors=[opened["cursor"]["id"]])
            watches = proxied.admin.command("parallelChangeStreamStatus")["watches"]
            assert watches == {"accelerated": 1, "passedThrough": 5}

        await sync(work)


@pytest.mark.parametrize(("pipeline", "events"), [(DEBEZIUM, 43), (DEBEZIUM_SKIP + DEBEZIUM, 41)])
async def test_debeziums_watch_is_accelerated_and_equals_mongos(pipeline, events):
    """Debezium's default pipeline ($replaceRoot with $concat and $$ROOT, a $match by regex on the
    namespace, then the event made the root again; tests/unit/test_change_stages.py DEBEZIUM), as
    its connector opens it on a cluster, and with its oversize "skip" mode ($expr, $bsonSize)
    before it: served by the engine, event for event as mongos."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            direct.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
            direct.shop.orders.insert_many([{"_id": i} for i in range(20)])
            direct.shop.orders.insert_one(
                {"_id": 100, "pad": "x" * 64}
            )  # over the skip mode's 40 bytes
            direct.shop.carts.insert_one({"_id": 1})  # not matched
            direct.shop.orders.update_many({}, {"$set": {"paid": True}})
            direct.shop.items.delete_many({})
            direct.shop.items.insert_one({"_id": "last"})
            runs = [
                _collect(
                    c.watch(pipeline, start_at_operation_time=start, full_document="updateLookup"),
                    lambda ev: ev["documentKey"]["_id"] == "last",
                )
                for c in (direct, proxied)
            ]
            assert len(runs[0]) == events and [bson.encode(e) for e in runs[1]] == [
                bson.encode(e) for e in runs[0]
            ]
            assert proxied.admin.command("parallelChangeStreamStatus")["watches"] == {
                "accelerated": 1,
                "passedThrough": 0,
            }

        await sync(work)


async def test_a_watch_with_ifnull_is_accelerated_and_equals_mongos():
    """$ifNull (any number of inputs) in a stage: a looked-up document's field, else the key."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            direct.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
            direct.shop.orders.insert_many(
                [{"_id": i, **({"name": f"n{i}"} if i % 2 else {})} for i in range(10)]
            )
            direct.shop.orders.update_many({}, {"$set": {"paid": True}})
            direct.shop.orders.delete_one({"_id": 3})
            direct.shop.items.insert_one({"_id": "last"})
            pipeline = [
                {
                    "$set": {
                        "who": {"$ifNull": ["$fullDocument.name", "$nothing", "$documentKey._id"]}
                    }
                }
            ]
            runs = [
                _collect(
                    c.watch(pipeline, start_at_operation_time=start, full_document="updateLookup"),
                    lambda ev: ev["documentKey"]["_id"] == "last",
                )
                for c in (direct, proxied)
            ]
            assert len(runs[0]) == 22 and [bson.encode(e) for e in runs[1]] == [
                bson.encode(e) for e in runs[0]
            ]
            assert {ev["who"] for ev in runs[0]} == {
                *range(0, 10, 2),
                3,
                *(f"n{i}" for i in range(1, 10, 2)),
                "last",
            }
            assert server.engine.watches == {"accelerated": 1, "passedThrough": 0}

        await sync(work)


async def test_stages_are_shaped_in_worker_processes_as_mongos_shapes_them():
    """With readerProcesses, a getMore's events go through the stages in runs over worker
    processes (buckets/shaping.py): the same events as mongos, in order, and a stage's error is
    the first failing event's, with its code."""
    async with accelerated(shards=2, reader_processes=2) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            direct.admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
            direct.shop.orders.insert_many(
                [{"_id": i, "n": i} for i in range(3 * SHAPE_RUN_EVENTS)]
            )
            direct.shop.orders.update_many(
                {"n": {"$lt": SHAPE_RUN_EVENTS}}, {"$set": {"paid": True}}
            )
            direct.shop.items.insert_one({"_id": "last"})
            status = {}

            def last(ev: Any) -> bool:  # the proxy's status read while its stream is still open
                status.update(proxied.admin.command("parallelChangeStreamStatus"))
                return ev["documentKey"]["_id"] == "last"

            runs = [
                _collect(
                    c.watch(DEBEZIUM, start_at_operation_time=start, full_document="updateLookup"),
                    last,
                )
                for c in (direct, proxied)
            ]
            assert len(runs[0]) == 4 * SHAPE_RUN_EVENTS + 1
            assert [bson.encode(e) for e in runs[1]] == [bson.encode(e) for e in runs[0]]
            assert status["streams"][0]["stageRunsInProcesses"] >= 2
            assert server.engine.watches == {"accelerated": 1, "passedThrough": 0}
            # Only the 500th event (in the second run) fails the $concat: its n is no string.
            direct.shop.notes.insert_many(
                [{"_id": i, "n": 499 if i == 499 else str(i)} for i in range(600)]
            )
            errors = []
            for c in (direct, proxied):
                with pytest.raises(OperationFailure) as info:
                    _collect(
                        c.shop.notes.watch(
                            [{"$set": {"c": {"$concat": ["$fullDocument.n", "!"]}}}],
                            start_at_operation_time=start,
                        ),
                        lambda ev: False,
                    )
                errors.append((info.value.code, info.value.details["errmsg"]))
            assert errors[0] == errors[1] == (16702, "$concat only supports strings, not int")

        await sync(work)


def _imaged_hashed_collection(cluster: Any, server: Any, db: str) -> tuple[Any, Any]:
    """Clients to mongos and to the proxy, and `db`.h hashed over the shards with pre- and
    post-images recorded."""
    direct = client(cluster.uri)
    direct.admin.command("shardCollection", f"{db}.h", key={"_id": "hashed"})
    direct[db].command({"collMod": "h", "changeStreamPreAndPostImages": {"enabled": True}})
    return direct, client(f"mongodb://127.0.0.1:{server.port}/")


async def test_pre_images_through_the_accelerated_proxy_equal_mongos():
    """fullDocumentBeforeChange: the engine reads the pre-images the shards recorded."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied = _imaged_hashed_collection(cluster, server, "pre")
            direct.pre.plain.insert_one({"_id": 0})
            start = direct.admin.command("ping")["operationTime"]
            direct.pre.h.insert_many([{"_id": i, "v": i} for i in range(20)])
            direct.pre.h.update_many({"v": {"$lt": 5}}, {"$inc": {"v": 100}})
            direct.pre.h.replace_one({"_id": 7}, {"replaced": True})
            direct.pre.h.delete_many({"v": {"$gte": 15}})
            with (
                direct.start_session() as s
            ):  # one shard, one applyOps entry: images at (its ts, index)
                s.with_transaction(
                    lambda s: (
                        direct.pre.h.update_one({"_id": 10}, {"$set": {"t": 1}}, session=s),
                        direct.pre.h.update_one({"_id": 10}, {"$inc": {"t": 1}}, session=s),
                    )
                )
            direct.pre.h.insert_one({"_id": "end", "marker": True})
            images = (
                {"full_document_before_change": "whenAvailable"},
                {"full_document": "whenAvailable"},
                {"full_document": "required", "full_document_before_change": "required"},
            )
            for name, target in (("collection", lambda c: c.pre.h), ("cluster", lambda c: c)):
                for options in images:
                    want = _collect(
                        target(direct).watch(
                            start_at_operation_time=start, max_await_time_ms=200, **options
                        ),
                        _is_marker,
                    )
                    stream = target(proxied).watch(
                        start_at_operation_time=start, max_await_time_ms=200, **options
                    )
                    assert (
                        proxied.admin.command("parallelChangeStreamStatus")["cursors"] == 1
                    )  # the engine's
                    got = _collect(stream, _is_marker)
                    assert [bson.encode(e) for e in got] == [bson.encode(e) for e in want], (
                        name,
                        options,
                    )
            in_txn = [e for e in got if "txnNumber" in e]
            assert [(e["fullDocumentBeforeChange"], e["fullDocument"]) for e in in_txn] == [
                ({"_id": 10, "v": 10}, {"_id": 10, "v": 10, "t": 1}),
                ({"_id": 10, "v": 10, "t": 1}, {"_id": 10, "v": 10, "t": 2}),
            ]
            after = [
                e["fullDocument"]
                for e in got
                if e["operationType"] == "update" and "txnNumber" not in e
            ]
            assert len(after) == 5 and all(
                a["v"] >= 100 for a in after
            )  # post-images: pre-image + update
            before = [
                e["fullDocumentBeforeChange"]
                for e in got
                if e["operationType"] != "insert" and "txnNumber" not in e
            ]
            # 5 updates, a replace, and 10 deletes (v >= 15, counting the 5 updated past 100)
            assert (
                len(before) == 16
                and {"_id": 7, "v": 7} in before
                and all(b is not None for b in before)
            )
            # required, on a collection that keeps no pre-images: the server's error, through the
            # engine too.
            direct.pre.plain.delete_one({"_id": 0})
            with (
                proxied.pre.plain.watch(
                    start_at_operation_time=start,
                    max_await_time_ms=200,
                    full_document_before_change="required",
                ) as s,
                pytest.raises(OperationFailure) as info,
            ):
                for _ in range(50):
                    s.try_next()
            assert info.value.code == 47  # NoMatchingDocument

        await sync(work)


async def test_fail_points_hit_the_proxys_cursors_as_often_as_mongos_alone_would():
    """A fail point armed on mongos through the proxy fires on the engine's getMores too, and the
    two together fire no more often than mongos alone would (wireproxy/failpoints.py)."""
    async with accelerated(shards=2) as (_cluster, server):

        def work():
            proxied = client(f"mongodb://127.0.0.1:{server.port}/", retryReads=False)
            proxied.fp.c.insert_many([{"_id": i} for i in range(10)])

            def arm(name: str, times: int, **data: Any) -> None:
                proxied.admin.command(
                    "configureFailPoint", name, mode={"times": times}, data={"errorCode": 2, **data}
                )

            found = proxied.fp.c.find(batch_size=2)  # a cursor of mongos's, passed through
            next(found), next(found)  # its first batch: the next document takes a getMore
            stream = proxied.fp.c.watch(max_await_time_ms=50)  # the engine's
            # failCommand twice: the engine's getMore takes one firing (mongos decides, by a
            # probe), mongos's own getMore the other, and then it is spent.
            arm("failCommand", 2, failCommands=["getMore"])
            with pytest.raises(OperationFailure) as info:
                stream.try_next()
            assert info.value.code == 2
            with pytest.raises(OperationFailure) as info:
                next(found)
            assert info.value.code == 2
            stream = proxied.fp.c.watch(max_await_time_ms=50)
            assert stream.try_next() is None
            assert len(list(proxied.fp.c.find(batch_size=2))) == 10
            # failGetMoreAfterCursorCheckout once: the proxy fires it on its cursor, then mongos's
            # copy is off, so mongos's next getMore succeeds.
            arm("failGetMoreAfterCursorCheckout", 1)
            with pytest.raises(OperationFailure) as info:
                stream.try_next()
            assert info.value.code == 2
            assert len(list(proxied.fp.c.find(batch_size=2))) == 10
            assert server.engine.watches == {"accelerated": 2, "passedThrough": 0}

        await sync(work)


async def test_a_replica_set_upstream_is_one_shard_to_the_engine():
    """In front of a replica set (no mongos), parallelChangeStream and watch() are the engine's:
    one reader, the same events and tokens as the set's own stream, dealt into buckets."""
    async with (
        open_cluster(shards=1, periodic_noop_s=0.2) as cluster,
        trio.open_nursery() as nursery,
    ):
        upstream = f"mongodb://{cluster.shards['shard0'].address}/"
        server = await nursery.start(
            serve_proxy,
            ProxyConfig(upstream=upstream, listen_port=0, accelerate_change_streams=True),
        )

        def work():
            direct = client(cluster.shard_uri("shard0"))
            proxied = client(f"mongodb://127.0.0.1:{server.port}/")
            start = direct.admin.command("ping")["operationTime"]
            opened = proxied.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 2, "startAtOperationTime": start}
            )
            for i in range(3):
                direct.rs[f"c{i}"].insert_many([{"_id": j} for j in range(5)])
            direct.rs.c0.insert_one({"_id": "end", "marker": True})
            want = _collect(
                direct.watch(start_at_operation_time=start, max_await_time_ms=100), _is_marker
            )
            got = _collect(
                proxied.watch(start_at_operation_time=start, max_await_time_ms=100), _is_marker
            )
            assert [bson.encode(e) for e in got] == [bson.encode(e) for e in want] and len(
                want
            ) == 16
            union = []
            for cur in opened["cursors"]:
                while True:
                    reply = proxied.admin.command(
                        {
                            "getMore": cur["id"],
                            "collection": "$cmd.parallelChangeStream",
                            "maxTimeMS": 100,
                        }
                    )
                    union += reply["cursor"]["nextBatch"]
                    if reply["cursor"]["postBatchResumeToken"]["_data"] >= want[-1]["_id"]["_data"]:
                        break
            assert sorted(bson.encode(e) for e in union) == sorted(bson.encode(e) for e in want)
            assert server.engine.watches["accelerated"] == 1

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_images_of_chained_and_prepared_transactions_are_found_where_the_server_keeps_them():
    """A transaction over two shards (prepared, then committed) and one too large for one
    applyOps entry (a partialTxn chain): the server keeps each write's pre-image under the ts of
    the applyOps entry that holds it and its index there (the unwinder's applyOpsTs and
    applyOpsIndex), not under the event's clusterTime and txnOpIndex. The engine must look there."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied = _imaged_hashed_collection(cluster, server, "img")
            direct.img.command(
                {"create": "u", "changeStreamPreAndPostImages": {"enabled": True}}
            )  # one shard
            direct.img.h.insert_many([{"_id": i, "v": 0} for i in range(20)])
            direct.img.u.insert_many([{"_id": i, "v": 0} for i in range(700)])
            start = direct.admin.command("ping")["operationTime"]
            # Plain writes before the transactions: each shard's batch a backlog's, whose
            # transactions the splice may take into its block (batch_splice.splice_entries),
            # which keeps no applied-at times: a stream that reads images keeps them out.
            direct.img.h.insert_many([{"_id": 100 + i, "v": 0} for i in range(600)])
            with direct.start_session() as s:  # both shards: prepared on each, then committed
                s.with_transaction(
                    lambda s: [
                        direct.img.h.update_one({"_id": i}, {"$inc": {"v": 1}}, session=s)
                        for i in range(6)
                    ]
                )
            with (
                direct.start_session() as s
            ):  # 700 writes on one shard: a chain of two applyOps entries
                s.with_transaction(
                    lambda s: direct.img.u.update_many({}, {"$inc": {"v": 1}}, session=s)
                )
            direct.img.u.insert_one({"_id": "end", "marker": True})
            options = {"full_document_before_change": "required", "full_document": "required"}
            want = _collect(
                direct.img.watch(start_at_operation_time=start, max_await_time_ms=200, **options),
                _is_marker,
            )
            got = _collect(
                proxied.img.watch(start_at_operation_time=start, max_await_time_ms=200, **options),
                _is_marker,
            )
            assert [bson.encode(e) for e in got] == [bson.encode(e) for e in want]
            updates = [e for e in got if e["operationType"] == "update"]
            assert len(updates) == 6 + 700
            assert all(
                e["fullDocumentBeforeChange"]["v"] + 1 == e["fullDocument"]["v"] for e in updates
            )
            # The shards keep most of those images under ts that no event has as its clusterTime:
            # the prepare entries' and the chains' earlier links (looked up by clusterTime, these
            # images were not found: 'required' failed).
            event_times = {e["clusterTime"] for e in updates}
            image_times = set()
            for sid in cluster.shards:
                member = client(cluster.shard_uri(sid))
                image_times |= {
                    d["_id"]["ts"]
                    for d in member.config.system.preimages.find({"_id.ts": {"$gt": start}})
                }
            assert (
                len(image_times - event_times) >= 3
            )  # two prepare entries and the chain's first link

        await sync(work)


async def test_a_watch_from_a_past_time_sees_the_events_dealt_before_its_cursor_existed():
    """A new stream's readers start as soon as the oplogs are known to reach back, and on a
    backlog they may deal events before the aggregate that created the stream makes its cursor;
    the cursor starts at the stream's start, so none are skipped (at the bucket's end, a 1M-event
    catch-up lost its first few hundred now and then, when a GC pause delayed the aggregate).
    In-process the race rarely opens: tests/integration/test_engine.py forces it; this checks the
    whole path."""
    async with accelerated(shards=3) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            direct.admin.command("shardCollection", "past.h", key={"_id": "hashed"})
            for chunk in range(8):
                direct.past.h.insert_many([{"_id": chunk * 1000 + i} for i in range(1000)])
            direct.past.h.insert_one({"_id": "end", "marker": True})
            for attempt in range(4):
                with proxied.watch(start_at_operation_time=start, batch_size=5000) as stream:
                    events = _collect(stream, _is_marker)
                inserts = [ev for ev in events if ev["operationType"] == "insert"]
                assert len(inserts) == 8001, (attempt, len(inserts))

        await sync(work, timeout=120)
