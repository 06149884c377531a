"""The parallelChangeStream command end to end: pymongo -> wireproxy -> engine -> simcluster.

The reference stream is built the way mongos builds its own: every shard's oplog transformed to
events and merged by resume token. The union of the buckets must equal it event for event and
token for token; each bucket must be in token order; each namespace must keep its order.
"""

from __future__ import annotations

import functools
import os
import random
import time
from typing import Any

import bson
import pytest
import trio
from bson import Decimal128, Int64, Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo.command_cursor import CommandCursor
from pymongo.errors import OperationFailure

import buckets.streams as streams_module
from buckets.bucketing import BUCKET_BY, bucket_of, bucket_of_document
from buckets.engine_base import new_cursor
from buckets.event_run import fields_of
from mongoformats.change_events import EV_RAW, RAW, OplogTransformer
from mongoformats.resume_token import high_water_mark, token_from_key, token_sort_key
from simcluster import open_cluster
from tests.conftest import (
    _close_all,
    client,
    free_port,
    poll_until,
    proxy_uri,
    scrape,
    sync,
    wait_until,
)
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

NS = "$cmd.parallelChangeStream"


def key(token: Any) -> bytes:
    return bytes.fromhex(token["_data"])


def workload(c: Any, seed: int, n: int = 300) -> None:
    """Inserts, every update kind, replaces, deletes, DDL, a hashed and a ranged sharded collection,
    a chunk migration, and the balancer on: w1.big (1 MB chunks) fills one shard with 4.5 MB while
    the workload runs, and the balancer moves ranges of it away meanwhile. Updates and deletes
    target documents that exist."""
    rng, big = (
        random.Random(seed),
        random.Random(-seed),
    )  # big: w1.big's, so rng's ops stay as they were
    c.admin.command(
        "configureFailPoint",
        "overrideBalanceRoundInterval",
        mode="alwaysOn",
        data={"intervalMs": 20},
    )
    c.admin.command("balancerStart")
    c.admin.command("shardCollection", "w0.h", key={"_id": "hashed"})
    c.admin.command("shardCollection", "w1.r", key={"k": 1})
    c.admin.command("shardCollection", "w1.big", key={"k": 1})
    c.admin.command("configureCollectionBalancing", "w1.big", chunkSize=1)
    live: list[tuple[str, str, int]] = []
    for i in range(n):
        if i % 20 == 0:  # 15 batches of 30 documents of 10 KB, and writes to those already there
            c.w1.big.insert_many([{"k": i * 100 + j, "pad": "x" * 10_000} for j in range(30)])
            lo = big.randrange(i * 100 + 30)
            c.w1.big.update_many({"k": {"$gte": lo, "$lt": lo + 150}}, {"$inc": {"n": 1}})
            c.w1.big.delete_one({"k": big.randrange(i * 100 + 30)})
        op = rng.random()
        if op < 0.45 or not live:
            db, coll = f"w{rng.randrange(4)}", rng.choice(["a", "b", "c"])
            c[db][coll].insert_one(
                {"_id": i, "v": rng.randrange(100), "arr": [1, 2, 3], "sub": {"x": 1}}
            )
            c.w0.h.insert_one({"_id": i, "x": i})
            live.append((db, coll, i))
            continue
        db, coll, doc_id = rng.choice(live)
        target = c[db][coll]
        if op < 0.55:
            target.update_one({"_id": doc_id}, {"$inc": {"v": 1}, "$set": {"arr.1": 5, "sub.y": 2}})
        elif op < 0.62:
            target.update_one({"_id": doc_id}, {"$unset": {"sub": ""}, "$push": {"arr": 9}})
        elif op < 0.68:
            target.update_one({"_id": doc_id}, {"$pop": {"arr": 1}, "$rename": {"v": "w"}})
        elif op < 0.76:
            target.replace_one(
                {"_id": doc_id}, {"replaced": True, "n": i, "arr": [i]}
            )  # arr stays an array
        elif op < 0.84:
            target.delete_one({"_id": doc_id})
            live.remove((db, coll, doc_id))
        elif op < 0.9:
            c.w0.h.update_many({"x": {"$lt": 5}}, {"$inc": {"x": 1}})
        else:
            c.w1.r.insert_many([{"k": rng.randrange(1000)} for _ in range(3)])
    with c.start_session() as s:  # a transaction across shards (hashed w0.h) and another collection
        s.with_transaction(
            lambda s: (
                c.w0.h.insert_many([{"_id": 10_000 + j, "x": j} for j in range(6)], session=s),
                c.w3.t.update_many({}, {"$inc": {"t": 1}}, upsert=True, session=s),
            )
        )
    with c.start_session() as s:  # aborted: no events
        s.start_transaction()
        c.w0.h.insert_one({"_id": -5}, session=s)
        s.abort_transaction()
    c.w2.a.create_index("v")
    c.w2.command({"collMod": "a", "validationLevel": "moderate"})
    c.w2.a.drop_index("v_1")
    shards = sorted(s["_id"] for s in c.admin.command("listShards")["shards"])
    c.admin.command("moveChunk", "w1.r", find={"k": 1}, to=shards[-1])
    wait_until(
        lambda: c.admin.command("balancerCollectionStatus", "w1.big")["balancerCompliant"],
        timeout=30,
    )


def native_stream(c: Any, start: Timestamp, end_key: bytes) -> list[RawBSONDocument]:
    """mongos's own change stream of the whole cluster, expanded events on, from start up to
    end_key."""
    # A note on every shard past the end: mongos releases nothing until every shard has written past
    # it, and an idle shard otherwise waits for its periodic noop (the engine nudges idle shards
    # itself).
    c.admin.command("appendOplogNote", data={"test": "past the end"})
    reply = c.admin.command(
        {
            "aggregate": 1,
            "cursor": {},
            "pipeline": [
                {
                    "$changeStream": {
                        "allChangesForCluster": True,
                        "showExpandedEvents": True,
                        "startAtOperationTime": start,
                    }
                }
            ],
        },
        codec_options=RAW,
    )
    events = list(reply["cursor"]["firstBatch"]) + drain(
        c, reply["cursor"]["id"], end_key, collection="$cmd.aggregate"
    )
    return [e for e in events if key(e["_id"]) <= end_key]


def reference(cluster: Any, start: Timestamp, end_key: bytes) -> list[bytes]:
    """Tokens of every event mongos would deliver in (HWM(start), end_key], in order."""
    floor = token_sort_key(high_water_mark(start))
    keys = []
    for node in cluster.shards.values():
        tr = OplogTransformer(show_expanded_events=True)
        for raw in node.oplog.read_after(0, 1 << 30):
            keys += [
                e.sort_key
                for e in tr.transform(RawBSONDocument(raw, RAW))
                if floor < e.sort_key <= end_key
            ]
    return sorted(keys)


def drain(
    c: Any,
    cursor_id: int,
    end_key: bytes,
    timeout: float = 30,
    *,
    db: str = "admin",
    collection: str = NS,
) -> list[RawBSONDocument]:
    """getMore on one bucket (or another change stream cursor) until its postBatchResumeToken passes
    end_key."""
    out: list[RawBSONDocument] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = c[db].command(
            {"getMore": cursor_id, "collection": collection, "maxTimeMS": 300}, codec_options=RAW
        )
        out += list(r["cursor"]["nextBatch"])
        if key(r["cursor"]["postBatchResumeToken"]) >= end_key:
            return out
    raise AssertionError("bucket did not reach the end point in time")


def end_point(c: Any) -> bytes:
    """A note on every shard, then the high-water mark just past it."""
    c.admin.command("appendOplogNote", data={"test": "end"})
    ts = c.admin.command("ping")["operationTime"]
    return token_sort_key(high_water_mark(Timestamp(ts.time, ts.inc + 1)))


def _union_cases() -> list[tuple[int, int, int, str]]:
    """(nBuckets, readerProcesses, workload seed, bucketBy): four in the suite; UNION_SEEDS=100-160
    adds a longer run over more bucket counts, reader processes and both bucketBy modes."""
    cases = [
        (1, 0, 1, "namespace"),
        (4, 2, 4, "namespace"),
        (16, 0, 16, "namespace"),
        (4, 2, 5, "documentKey"),
    ]
    lo, _, hi = os.environ.get("UNION_SEEDS", "").partition("-")
    if lo:
        cases += [
            ([1, 3, 4, 7, 16][s % 5], s % 3, s, BUCKET_BY[s % 2])
            for s in range(int(lo), int(hi or lo) + 1)
        ]
    return cases


def _bucket_of_event(e: RawBSONDocument, n: int, by: str) -> set[int]:
    """The buckets an event belongs in (buckets/bucketing.py's contract, computed from the
    event)."""
    ns = e["ns"]
    if by == "documentKey":
        if "documentKey" not in e:
            return set(range(n))
        return {bucket_of_document(f"{ns['db']}.{ns['coll']}", e["documentKey"]["_id"], n)}
    if "coll" in ns and e["operationType"] != "rename":
        return {bucket_of(f"{ns['db']}.{ns['coll']}", n)}
    return set(range(n))  # not checked here: spans namespaces


@pytest.mark.parametrize(("n_buckets", "reader_processes", "seed", "bucket_by"), _union_cases())
async def test_union_of_buckets_equals_the_merged_stream(
    cluster, proxy, n_buckets, reader_processes, seed, bucket_by
):
    """With readerProcesses the entries are spliced in worker processes: the same events must come
    out. By documentKey, every event lies in its document's bucket and every event without a
    documentKey (DDL) in every bucket."""

    def work():
        c = client(proxy_uri(proxy))
        start = c.admin.command("ping")["operationTime"]
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": n_buckets,
                "showExpandedEvents": True,
                "startAtOperationTime": start,
                "readerProcesses": reader_processes,
                "bucketBy": bucket_by,
            }
        )
        assert opened["bucketBy"] == bucket_by
        per_bucket: list[set[bytes]] = []
        assert [cur["bucket"] for cur in opened["cursors"]] == list(range(n_buckets))
        workload(c, seed=seed)
        end = end_point(c)
        union: dict[bytes, RawBSONDocument] = {}
        for cur in opened["cursors"]:
            events = drain(c, cur["id"], end)
            keys = [key(e["_id"]) for e in events]
            assert keys == sorted(keys) and len(set(keys)) == len(keys), (
                "bucket out of order or duplicated"
            )
            per_bucket.append(set(keys))
            for e in events:
                assert cur["bucket"] in _bucket_of_event(e, n_buckets, bucket_by)
                union[key(e["_id"])] = e
        for k, e in union.items():  # and nowhere else
            assert {i for i, held in enumerate(per_bucket) if k in held} <= _bucket_of_event(
                e, n_buckets, bucket_by
            )
            if bucket_by == "documentKey" and "documentKey" not in e:
                assert all(k in held for held in per_bucket), "a DDL event missing from a bucket"
        expected = reference(cluster, start, end)
        assert sorted(union) == expected
        assert len(expected) > 300
        # Event for event and byte for byte what mongos's own stream delivers, in its order.
        native = native_stream(client(cluster.uri), start, end)
        assert [union[k].raw for k in sorted(union)] == [e.raw for e in native]
        assert cluster.mongos.balancer.migrations >= 2, (
            "the balancer moved nothing while the stream ran"
        )
        kinds = {e["operationType"] for e in union.values()}
        assert {
            "insert",
            "update",
            "replace",
            "delete",
            "createIndexes",
            "dropIndexes",
            "modify",
            "shardCollection",
            "create",
        } <= kinds
        # No migration write leaks out (fromMigrate entries are hidden, as on mongos): the moved
        # chunk's documents were inserted again on the recipient, yet each shows up once.
        inserts = sum(
            1
            for e in union.values()
            if e["operationType"] == "insert"
            and (e["ns"]["db"], e["ns"].get("coll")) == ("w1", "r")
        )
        assert inserts == c.w1.r.count_documents({})
        in_txn = [e for e in union.values() if "txnNumber" in e]
        assert len({e["clusterTime"] for e in in_txn}) >= 2  # prepared on several shards
        # The upsert into w3.t creates it inside the transaction: its create is in the applyOps
        # too, with the transaction's lsid and txnNumber (D6b; ddl_create_index_txn.js).
        assert sorted(e["operationType"] for e in in_txn) == ["create"] + ["insert"] * 7

    await sync(work)


async def test_command_errors_use_server_codes(proxy):
    def work():
        c = client(proxy_uri(proxy))
        cases = [
            ({"nBuckets": 0}, 2),
            ({"nBuckets": 2000}, 2),
            ({"nBuckets": "4"}, 14),
            ({"nBuckets": True}, 14),
            # doubles with no integer value (found by the fuzz test: int() of them raised)
            ({"nBuckets": float("inf")}, 2),
            ({"nBuckets": float("nan")}, 2),
            ({"nBuckets": 2, "maxAwaitTimeMS": float("-inf")}, 2),
            ({"nBuckets": 4, "bogus": 1}, 40415),
            ({"nBuckets": 2, "readerProcesses": -1}, 2),
            ({"nBuckets": 2, "showSystemEvents": "yes"}, 14),
            ({"nBuckets": 2, "readerProcesses": 65}, 2),
            # bucket tokens of another bucket count, not all the same
            (
                {
                    "nBuckets": 4,
                    "resumeAfter": [high_water_mark(Timestamp(1, i)) for i in (1, 2, 1)],
                },
                2,
            ),
            (
                {
                    "nBuckets": 4,
                    "startAtOperationTime": Timestamp(1, 1),
                    "resumeAfter": {"_data": "00"},
                },
                40674,
            ),
            ({"nBuckets": 2, "fullDocument": "bogus"}, 2),
            ({"nBuckets": 2, "fullDocumentBeforeChange": "sometimes"}, 2),
            (
                {
                    "nBuckets": 2,
                    "fullDocument": "updateLookup",
                    "pipeline": [{"$match": {"fullDocument.v": 1}}],
                },
                2,
            ),
            # $$ROOT holds the post-image too, which the $match (run before lookups) would not see
            (
                {
                    "nBuckets": 2,
                    "fullDocument": "updateLookup",
                    "pipeline": [{"$match": {"$expr": {"$lt": [{"$bsonSize": "$$ROOT"}, 100]}}}],
                },
                2,
            ),
            (
                {
                    "nBuckets": 2,
                    "pipeline": [{"$match": {"$expr": {"$eq": [{"$toUpper": "$v"}, "A"]}}}],
                },
                2,
            ),
            ({"nBuckets": 2, "pipeline": [{"$match": {"v": {"$mod": [2, 0]}}}]}, 2),
        ]
        for extra, code in cases:
            with pytest.raises(OperationFailure) as info:
                c.admin.command({"parallelChangeStream": 1, **extra})
            assert info.value.code == code, extra
        with pytest.raises(OperationFailure) as info:
            c.test.command({"parallelChangeStream": 1, "nBuckets": 2})
        assert info.value.code == 13
        with pytest.raises(OperationFailure) as info:
            c.admin.command({"parallelChangeStreamStatus": 1, "name": "nope"})
        assert info.value.code == 26
        # null options are options not given, as for the server's parsers
        c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 1,
                "fullDocument": None,
                "resumeAfter": None,
                "startAtOperationTime": None,
                "shardBufferBytes": None,
                "name": None,
            }
        )
        opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "name": "mine"})
        other = client(proxy_uri(proxy))
        with pytest.raises(OperationFailure) as info:  # another session's cursor
            other.admin.command({"getMore": opened["cursors"][0]["id"], "collection": NS})
        assert info.value.code == 13

    await sync(work)


async def test_malformed_cursor_commands_fail_as_the_servers_parser_fails_them(cluster, proxy):
    """The IDL errors of getMore and killCursors, for mongos's cursors and the engine's alike."""

    def work():
        c = client(proxy_uri(proxy))
        mine = c.admin.command({"parallelChangeStream": 1, "nBuckets": 1})["cursors"][0]["id"]
        theirs = (
            c.idl.c.insert_many([{"_id": i} for i in range(3)])
            and c.idl.command("find", "c", batchSize=1)["cursor"]["id"]
        )
        cases = [
            (
                {"getMore": 5, "collection": "c"},
                14,
                "BSON field 'getMore.getMore' is the wrong type 'int', expected type 'long'",
            ),
            (
                {"getMore": "{id}"},
                40414,
                "BSON field 'getMore.collection' is missing but a required field",
            ),
            (
                {"getMore": "{id}", "collection": 1},
                14,
                "BSON field 'getMore.collection' is the wrong type 'int', expected type 'string'",
            ),
            (
                {"getMore": "{id}", "collection": "{coll}", "maxTimeMS": "x"},
                14,
                "BSON field 'getMore.maxTimeMS' "
                "is the wrong type 'string', expected types '[long, int, decimal, double']",
            ),
            (
                {"killCursors": "{coll}"},
                40414,
                "BSON field 'killCursors.cursors' is missing but a required field",
            ),
            (
                {"killCursors": "{coll}", "cursors": 5},
                14,
                "BSON field 'killCursors.cursors' is the wrong type 'int', expected type 'array'",
            ),
            (
                {"killCursors": "{coll}", "cursors": ["{id}", 7]},
                14,
                "BSON field 'killCursors.cursors.1' is the wrong type 'int', expected type 'long'",
            ),
        ]
        for db, cid, coll in (("idl", theirs, "c"), ("admin", mine, NS)):
            for template, code, message in cases:
                cmd = {
                    k: (
                        cid
                        if v == "{id}"
                        else coll
                        if v == "{coll}"
                        else [cid if x == "{id}" else x for x in v]
                        if isinstance(v, list)
                        else v
                    )
                    for k, v in template.items()
                }
                with pytest.raises(OperationFailure) as info:
                    c[db].command(cmd)
                assert (info.value.code, info.value.details["errmsg"]) == (code, message), (db, cmd)
            wait = {"maxTimeMS": 10} if db == "admin" else {}  # (a find cursor takes none)
            assert (
                c[db].command({"getMore": cid, "collection": coll, **wait})["ok"] == 1
            )  # the cursor lives on

    await sync(work)


async def test_unknown_cursor_is_passed_to_mongos_and_fails_43(proxy):
    def work():
        c = client(proxy_uri(proxy))
        with pytest.raises(OperationFailure) as info:
            c.admin.command({"getMore": Int64(987654321), "collection": "x"})
        assert info.value.code == 43

    await sync(work)


async def test_history_lost_when_the_oplog_no_longer_reaches_back():
    async with (
        open_cluster(shards=2, oplog_bytes=40_000) as cluster,
        trio.open_nursery() as nursery,
    ):
        server = await nursery.start(serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0))

        def work():
            c = client(proxy_uri(server))
            start = c.admin.command("ping")["operationTime"]
            for i in range(20):
                c.t.c.insert_many([{"_id": i * 100 + j, "pad": "x" * 200} for j in range(100)])
            for reader_processes in (0, 1):  # the check runs where the tail runs
                with pytest.raises(OperationFailure) as info:
                    c.admin.command(
                        {
                            "parallelChangeStream": 1,
                            "nBuckets": 2,
                            "startAtOperationTime": start,
                            "readerProcesses": reader_processes,
                        }
                    )
                assert (
                    info.value.code == 286
                    and info.value.details["codeName"] == "ChangeStreamHistoryLost"
                )

        await sync(work)
        await sync(_close_all)  # while the proxy still answers endSessions
        nursery.cancel_scope.cancel()


async def test_slow_consumer_stays_within_the_byte_budgets(cluster, proxy):
    def work():
        c = client(proxy_uri(proxy))
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 1,
                "name": "slow",
                "bucketBufferBytes": 16_000,
                "shardBufferBytes": 16_000,
            }
        )
        for i in range(20):
            c.t.c.insert_many([{"_id": i * 100 + j, "pad": "y" * 100} for j in range(100)])
        deadline = time.monotonic() + 20
        while True:  # wait until the readers have run into the full buffers
            status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "slow"})["streams"][
                0
            ]
            if status["buckets"][0]["bytes"] > 8_000 or time.monotonic() > deadline:
                break
        bucket = status["buckets"][0]
        assert bucket["bytes"] <= 16_000
        for shard in status["shards"]:
            # A reader may hold one batch beyond the budget only when the budget was empty before
            # it.
            assert shard["bufferBytes"] <= 16_000 + 16 * 1024 * 1024
        assert status["mergeQueue"] < 2000
        end = end_point(c)
        events = drain(c, opened["cursors"][0]["id"], end, timeout=60)
        assert len([e for e in events if e["operationType"] == "insert"]) == 2000  # nothing lost

    await sync(work)


async def test_a_getmore_on_a_bucket_its_last_batch_fills_does_not_wait_out_its_max_time(
    cluster, proxy
):
    """A bucket budget smaller than the backlog: the events a getMore returned stay retained, and
    fill the bucket, until the next getMore says they were taken. That getMore frees them before
    it waits, so the merge puts more at once (it used to wait out its maxTimeMS every time: a
    drain at one batch per maxTimeMS)."""

    def work():
        c = client(proxy_uri(proxy))
        start = c.admin.command("ping")["operationTime"]
        c.full.c.insert_many([{"_id": i, "pad": "f" * 1000} for i in range(3000)])
        end = end_point(c)
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 1,
                "startAtOperationTime": start,
                "bucketBufferBytes": 200_000,
            }
        )
        started, getmores, ids = time.monotonic(), 0, []
        while True:
            r = c.admin.command(
                {"getMore": opened["cursors"][0]["id"], "collection": NS, "maxTimeMS": 10_000},
                codec_options=RAW,
            )
            getmores += 1
            ids += [
                e["documentKey"]["_id"] for e in r["cursor"]["nextBatch"] if e["ns"]["db"] == "full"
            ]
            if key(r["cursor"]["postBatchResumeToken"]) >= end:
                break
        assert ids == list(range(3000)) and getmores > 10
        assert time.monotonic() - started < 10  # waiting out one maxTimeMS each would take minutes

    await sync(work)


@pytest.mark.parametrize("reader_processes", [0, 1])
async def test_buckets_let_go_of_the_shard_blocks_they_point_into_when_a_shard_budget_fills(
    cluster, proxy, reader_processes
):
    """A backlog's bucket shares point into the shards' blocks, whose charge to the shard's budget
    returns only once the last share is freed. Buckets retain what they delivered up to their own
    budget, here far above the shards': the shards' budgets would stay full and the readers wait
    for ever. A full shard budget makes the buckets drop or copy out what they point into."""

    def work():
        c = client(proxy_uri(proxy))
        names = {}
        for i in range(100):  # a collection in each of the two buckets
            names.setdefault(bucket_of(f"pins.c{i}", 2), f"c{i}")
            if len(names) == 2:
                break
        start = c.admin.command("ping")["operationTime"]
        for _ in range(3):  # batches of plain inserts: the readers splice them into blocks
            for coll in names.values():
                c.pins[coll].insert_many([{"pad": "z" * 200} for _ in range(800)])
        end = end_point(c)
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 2,
                "name": f"pins{reader_processes}",
                "startAtOperationTime": start,
                "readerProcesses": reader_processes,
                "shardBufferBytes": 100_000,
                "bucketBufferBytes": 16 << 20,
            }
        )
        for cursor in opened["cursors"]:
            events = drain(c, cursor["id"], end, timeout=60)
            assert (
                len([e for e in events if e["operationType"] == "insert"]) == 2400
            )  # nothing lost
        status = c.admin.command(
            {"parallelChangeStreamStatus": 1, "name": f"pins{reader_processes}"}
        )
        assert all(s["bufferBytes"] == 0 for s in status["streams"][0]["shards"])
        assert (
            sum(b["bytes"] for b in status["streams"][0]["buckets"]) > 2 * 100_000
        )  # retained, not dropped

    await sync(work)


async def test_a_consumer_that_stops_inside_a_batch_resumes_from_memory(cluster, proxy):
    """A Spark task reads up to its end token, which may lie inside the last batch it fetched,
    then kills its cursor. The next micro-batch attaches after that token: even once the bucket is
    full, the proxy must still hold what follows it, not fall back to re-reading the oplogs."""

    def work():
        c = client(proxy_uri(proxy))
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 1,
                "name": "inside",
                "bucketBufferBytes": 30_000,
            }
        )
        c.m.c.insert_many([{"_id": i, "pad": "p" * 100} for i in range(100)])
        end_point(c)
        cid = opened["cursors"][0]["id"]
        got: list[RawBSONDocument] = []
        while len(got) < 60:
            r = c.admin.command(
                {"getMore": cid, "collection": NS, "batchSize": 100, "maxTimeMS": 300},
                codec_options=RAW,
            )
            got += list(r["cursor"]["nextBatch"])
        c.admin.command({"killCursors": NS, "cursors": [cid]})
        taken = got[:30]  # the task's end token was the 30th event of its last batch
        c.m.c.insert_many([{"_id": i, "pad": "p" * 100} for i in range(100, 400)])
        wait_until(
            lambda: (
                c.admin.command({"parallelChangeStreamStatus": 1, "name": "inside"})["streams"][0][
                    "buckets"
                ][0]["bytes"]
                > 25_000
            )
        )
        session = c.start_session()
        att = c.admin.command(
            {
                "parallelChangeStream": 1,
                "name": "inside",
                "bucket": 0,
                "resumeAfter": taken[-1]["_id"],
                "batchSize": 50,
            },
            codec_options=RAW,
            session=session,
        )
        cursor = CommandCursor(
            c.admin[NS], att["cursor"], c.address, max_await_time_ms=300, session=session
        )
        rest = []
        for ev in cursor:
            rest.append(ev["documentKey"]["_id"])
            if len(rest) == 370:
                break
        cursor.close()
        session.end_session()
        assert rest == list(range(30, 400))
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "inside"})["streams"][0]
        assert status["replays"] == 0

    await sync(work)


async def test_keys_of_every_number_and_a_failing_stream_hurts_no_other(cluster, proxy):
    """Fractional, tiny, huge and negative-zero doubles and decimals (with 34 digits, and beyond
    the double range) are document keys like any other. An oplog entry the engine cannot
    transform (an insert without _id, written straight into a shard's oplog) fails that stream
    with InternalError, as a server fails one cursor; the proxy and its other streams go on."""

    def work():
        c = client(proxy_uri(proxy))
        before = c.admin.command("ping")["operationTime"]
        now, _ = cluster.shards["shard0"].oplog.append(
            {"op": "i", "ns": "d.bad", "o": {"no": "id"}}
        )
        after = Timestamp(now.time, now.inc + 1)
        # The bad entry may be in a shard's first batch, which can be read before the open
        # replies: the open then fails as the server's aggregate does when its first batch holds
        # an entry it cannot transform. Otherwise the stream's first getMore fails.
        try:
            doomed = c.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 1, "startAtOperationTime": before}
            )
        except OperationFailure as failed_open:
            assert failed_open.code == 1, failed_open.details
            assert failed_open.details["codeName"] == "InternalError"
            doomed = None
        ok = c.admin.command(
            {"parallelChangeStream": 1, "nBuckets": 1, "startAtOperationTime": after}
        )
        keys = [
            1.5,
            -0.0,
            1e-300,
            -(2.0**70),
            float("inf"),
            0.1,
            Decimal128("0.1"),
            Decimal128("3.50"),
            Decimal128("-12345678901234567890.12345678901234"),
            Decimal128("NaN"),
            Decimal128("1E+400"),
            Decimal128("-2.5E-310"),
            Decimal128("1E-6176"),
            Decimal128("-0E+5"),
        ]
        c.d.c.insert_many([{"_id": v} for v in keys[:-1]])
        c.d.zero.insert_one({"_id": keys[-1]})  # equal to -0.0, so a duplicate key in d.c
        end = end_point(c)
        events = drain(c, ok["cursors"][0]["id"], end)
        got = [e["documentKey"]["_id"] for e in events]
        assert [repr(k) for k in got] == [repr(k) for k in keys]
        # The tokens carry the decimals' type bits, and resuming after each one works.
        assert all("_typeBits" in e["_id"] for e in events[6:])
        for e in events[6:]:
            resumed = c.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 1, "resumeAfter": e["_id"]}
            )
            c.admin.command(
                {"killCursors": NS, "cursors": [resumed["cursors"][0]["id"]]}
            )  # frees its budgets
        if doomed is not None:
            with pytest.raises(OperationFailure) as info:
                drain(c, doomed["cursors"][0]["id"], end)
            assert info.value.code == 1 and info.value.details["codeName"] == "InternalError"
        c.d.c.insert_one({"_id": 2.5})  # the other stream still runs
        later = drain(c, ok["cursors"][0]["id"], end_point(c))
        assert [e["documentKey"]["_id"] for e in later] == [2.5]

    await sync(work)


async def test_consumer_disconnects_and_resumes_from_its_token(cluster, proxy):
    def work():
        c = client(proxy_uri(proxy))
        opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "name": "resume"})
        c.r.c.insert_many([{"_id": i} for i in range(200)])
        end = end_point(c)
        b = bucket_of("r.c", 2)
        first = c.admin.command(
            {"getMore": opened["cursors"][b]["id"], "collection": NS, "batchSize": 50},
            codec_options=RAW,
        )
        got = list(first["cursor"]["nextBatch"])
        assert len(got) == 50
        c.admin.command({"killCursors": NS, "cursors": [opened["cursors"][b]["id"]]})
        # A standard cursor document: unmodified pymongo iterates it with CommandCursor.
        fresh = client(proxy_uri(proxy))
        # Like the server, the proxy ties a cursor to the session that created it: iterate in it.
        session = fresh.start_session()
        att = fresh.admin.command(
            {
                "parallelChangeStream": 1,
                "name": "resume",
                "bucket": b,
                "resumeAfter": got[-1]["_id"],
                "batchSize": 10,
            },
            codec_options=RAW,
            session=session,
        )
        cursor = CommandCursor(
            fresh.admin[NS], att["cursor"], fresh.address, max_await_time_ms=300, session=session
        )
        rest = []
        for ev in cursor:
            rest.append(ev)
            if len(rest) == 150:
                break
        cursor.close()
        session.end_session()
        ids = [e["documentKey"]["_id"] for e in got + rest]
        assert ids == list(range(200))
        assert key(rest[-1]["_id"]) <= end

    await sync(work)


async def test_proxy_restart_resumes_every_bucket(cluster):
    async def start_proxy(nursery):
        return await nursery.start(serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0))

    tokens: list[Any] = []
    seen: dict[bytes, Any] = {}
    async with trio.open_nursery() as n1:
        p1 = await start_proxy(n1)

        def phase1():
            c = client(proxy_uri(p1))
            opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 4, "name": "restart"})
            c.x.a.insert_many([{"_id": i} for i in range(100)])
            c.x.b.insert_many([{"_id": i} for i in range(100)])
            end = end_point(c)
            for cur in opened["cursors"]:
                r = c.admin.command(
                    {"getMore": cur["id"], "collection": NS, "batchSize": 30}, codec_options=RAW
                )
                evs = list(r["cursor"]["nextBatch"])
                for e in evs:
                    seen[key(e["_id"])] = e
                tokens.append(evs[-1]["_id"] if evs else r["cursor"]["postBatchResumeToken"])
            c.x.c.insert_many([{"_id": i} for i in range(50)])
            return end

        await sync(phase1)
        n1.cancel_scope.cancel()
    async with trio.open_nursery() as n2:
        p2 = await start_proxy(n2)

        def phase2():
            c = client(proxy_uri(p2))
            opened = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 4,
                    "name": "restart",
                    "resumeAfter": [bson.decode(t.raw) for t in tokens],
                }
            )
            end = end_point(c)
            for cur in opened["cursors"]:
                for e in drain(c, cur["id"], end):
                    k = key(e["_id"])
                    assert k not in seen, "duplicate after restart"
                    seen[k] = e
            ids = sorted(
                (e["ns"]["coll"], e["documentKey"]["_id"])
                for e in seen.values()
                if e["operationType"] == "insert"
            )
            assert ids == sorted(
                [(coll, i) for coll in "ab" for i in range(100)] + [("c", i) for i in range(50)]
            )

        await sync(phase2)
        n2.cancel_scope.cancel()


async def test_a_stream_changes_its_bucket_count_from_a_common_token(cluster, proxy, monkeypatch):
    """A consumer reads every bucket of a 2-bucket stream up to one token, then reopens the same
    name with 4 buckets from that token: the 4 buckets hold exactly what came after it, each
    namespace in its new bucket. Not while the old buckets are still read; their cursors, once
    unused, are killed with the old stream."""
    monkeypatch.setattr(streams_module, "CURSOR_IN_USE_S", 0.5)  # instead of 10 s

    def work():
        c = client(proxy_uri(proxy))
        opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "name": "grow"})
        colls = [
            c.g.a,
            c.g.b,
            c.h.c,
        ]  # g.a and g.b share bucket 1 of 2, and go to buckets 1 and 3 of 4
        for coll in colls:
            coll.insert_many([{"_id": i} for i in range(60)])
        end = end_point(c)
        before = [
            e for cur in opened["cursors"] for e in drain(c, cur["id"], end) if key(e["_id"]) <= end
        ]
        assert len(before) == 180
        common = token_from_key(end)
        with pytest.raises(OperationFailure, match="cursor.* read it") as info:
            c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 4,
                    "name": "grow",
                    "resumeAfter": [common] * 2,
                }
            )
        assert info.value.code == 117  # ConflictingOperationInProgress
        # The consumer stops without killCursors.
        for coll in colls:
            coll.insert_many([{"_id": i} for i in range(60, 100)])
        with pytest.raises(OperationFailure, match="all the same token") as info:
            c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 4,
                    "name": "grow",
                    "resumeAfter": [common, before[0]["_id"]],
                }
            )
        replies = []

        def reopen() -> bool:
            """As the Spark source does: retried while refused, until the old cursors count as
            unused."""
            try:
                replies.append(
                    c.admin.command(
                        {
                            "parallelChangeStream": 1,
                            "nBuckets": 4,
                            "name": "grow",
                            "resumeAfter": [common] * 2,
                        }
                    )
                )
                return True
            except OperationFailure as exc:
                assert exc.code == 117
                return False

        wait_until(reopen, timeout=10)
        reopened = replies[0]
        assert reopened["nBuckets"] == 4 and len(reopened["cursors"]) == 4
        with pytest.raises(OperationFailure) as info:
            c.admin.command({"getMore": opened["cursors"][0]["id"], "collection": NS})
        assert info.value.code == 43
        end = end_point(c)
        after = {}
        for b, cur in enumerate(reopened["cursors"]):
            for e in drain(c, cur["id"], end):
                ns = f"{e['ns']['db']}.{e['ns']['coll']}"
                assert bucket_of(ns, 4) == b
                after.setdefault(ns, []).append(e["documentKey"]["_id"])
        assert after == {coll.full_name: list(range(60, 100)) for coll in colls}
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "grow"})
        assert status["streamsRebucketed"] == 1 and status["streams"][0]["nBuckets"] == 4

    await sync(work)


async def test_idle_shards_do_not_delay_events(cluster, proxy):
    def work():
        c = client(proxy_uri(proxy))
        opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 1, "name": "idle"})
        c.only.one.insert_one({"_id": 1})  # one shard writes; the two others stay idle
        began = time.monotonic()
        while True:
            r = c.admin.command(
                {"getMore": opened["cursors"][0]["id"], "collection": NS, "maxTimeMS": 500}
            )
            if r["cursor"]["nextBatch"]:
                break
        waited = time.monotonic() - began
        assert waited < 3.0, (
            f"event held back {waited:.1f}s by idle shards (periodic noops are 10 s)"
        )
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "idle"})["streams"][0]
        assert sum(s["noops"] for s in status["shards"]) >= 1

    await sync(work)


async def test_status_figures_are_on_the_metrics_endpoint(cluster):
    """The per-shard and per-bucket figures of parallelChangeStreamStatus, scraped from /metrics."""
    port = free_port()
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(
            serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0, metrics_port=port)
        )

        def work():
            c = client(proxy_uri(proxy))
            opened = c.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 2, "name": "scraped", "readerProcesses": 1}
            )
            c.m.c.insert_many([{"_id": i} for i in range(40)])
            b = bucket_of("m.c", 2)
            events = drain(c, opened["cursors"][b]["id"], end_point(c))
            assert len(events) >= 40
            status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "scraped"})[
                "streams"
            ][0]
            assert all(
                s["lagSeconds"] is not None and s["lagSeconds"] < 60 for s in status["shards"]
            )
            lines = scrape(port)
            delivered = [
                ln
                for ln in lines
                if ln.startswith("pcs_bucket_delivered_total{")
                and f'bucket="{b}"' in ln
                and 'stream="scraped"' in ln
            ]
            assert delivered and float(delivered[0].split()[-1]) == len(events)
            for family in (
                "pcs_shard_lag_seconds",
                "pcs_shard_buffer_bytes",
                "pcs_shard_read_position_seconds",
                "pcs_shard_connected",
                "pcs_bucket_depth",
                "pcs_stream_events_merged_total",
            ):
                assert sum(ln.startswith(family + "{") for ln in lines) >= 1, family
            # three shards' floors, the buckets' and the reader process
            assert any(
                ln.startswith("pcs_memory_reserved_bytes ")
                and float(ln.split()[-1]) >= (192 + 2 + 300) << 20
                for ln in lines
            )
            assert (
                sum(ln.startswith("pcs_shard_entries_total{") for ln in lines) == 3
            )  # one per shard
            # the shared reader process, reading the stream's three shards
            assert {
                'pcs_reader_process_tails{process="0"} 3.0',
                'pcs_reader_process_alive{process="0"} 1.0',
            } <= set(lines)

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_a_stream_without_cursors_is_torn_down_after_the_configured_time(cluster):
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(upstream=cluster.uri, listen_port=0, stream_idle_teardown_s=0.5),
        )

        def work():
            c = client(proxy_uri(proxy))
            opened = c.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 2, "name": "short-lived"}
            )
            c.teardown.c.insert_many([{"i": i} for i in range(50)])
            wait_until(
                lambda: (
                    c.admin.command({"parallelChangeStreamStatus": 1, "name": "short-lived"})[
                        "streams"
                    ][0]["eventsMerged"]
                    >= 50
                )
            )  # retained in the buckets, while cursors live
            stream = proxy.engine.streams["short-lived"]
            c.admin.command(
                {"killCursors": NS, "cursors": [cur["id"] for cur in opened["cursors"]]}
            )

            # Watched on the engine itself: a status command counts as activity (Spark plans with
            # it).
            wait_until(lambda: "short-lived" not in proxy.engine.streams, timeout=10)
            # Its events are freed once it has unwound, not left to the rare full collections.
            wait_until(
                lambda: not any(b.segments or b.budget.used for b in stream.buckets.values()),
                timeout=10,
            )
            assert len(stream.merge) == 0
            with pytest.raises(OperationFailure) as info:
                c.admin.command({"parallelChangeStreamStatus": 1, "name": "short-lived"})
            assert info.value.code == 26

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_streams_beyond_the_memory_limit_are_refused_and_watches_pass_through(cluster):
    """Streams are admitted by their floor (buckets/memory_limit.py) under the proxy's memory
    limit: one that does not fit is refused with ExceededMemoryLimit (a parallel stream) or served
    by mongos (a watch()), and fits once the cursors of another are killed. Idle streams are
    closed for a new one only if that makes room."""
    mib = 1 << 20
    config = ProxyConfig(
        upstream=cluster.uri,
        listen_port=0,
        memory_limit_bytes=300 * mib,
        accelerate_change_streams=True,
    )
    small = {
        "parallelChangeStream": 1,
        "nBuckets": 2,
        "shardBufferBytes": 20 * mib,
        "bucketBufferBytes": 4 * mib,
    }
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(serve_proxy, config)

        def work():
            c = client(proxy_uri(proxy))
            first = c.admin.command({**small, "name": "first"})
            status = c.admin.command({"parallelChangeStreamStatus": 1})["memory"]
            figures = ("limitBytes", "reservedBytes", "floorBytes", "streamsRefused")
            assert {k: status[k] for k in figures} == {  # floors: 3 x 80 + 2 x 1
                "limitBytes": 300 * mib,
                "reservedBytes": 242 * mib,
                "floorBytes": 242 * mib,
                "streamsRefused": 0,
            }
            with pytest.raises(OperationFailure) as info:
                c.admin.command({**small, "name": "second"})
            assert info.value.code == 146
            assert "242 MiB of the proxy's 300 MiB memory limit is held by 1 open streams" in str(
                info.value
            )
            assert "second" not in proxy.engine.streams
            # A watch() (3 shards x 80 MiB + 1 MiB) does not fit either: mongos serves it instead.
            with c.mem.c.watch(max_await_time_ms=500) as watch:
                c.mem.c.insert_one({"_id": 1})
                assert watch.next()["documentKey"] == {"_id": 1}
            assert proxy.engine.watches == {"accelerated": 0, "passedThrough": 1}
            # A stream without cursors is kept for re-attaching until the idle teardown (300 s),
            # unless its memory is needed: then it goes at once.
            c.admin.command({"killCursors": NS, "cursors": [cur["id"] for cur in first["cursors"]]})
            second = c.admin.command({**small, "name": "second"})
            assert set(proxy.engine.streams) == {"second"}
            assert (
                c.admin.command({"parallelChangeStreamStatus": 1})["memory"]["streamsRefused"] == 2
            )
            # One that would not fit even in all the idle streams' room is refused, and they are
            # spared.
            c.admin.command(
                {"killCursors": NS, "cursors": [cur["id"] for cur in second["cursors"]]}
            )
            with pytest.raises(OperationFailure) as info:
                c.admin.command({**small, "name": "big", "nBuckets": 100})  # 3 x 80 + 100 x 1
            assert info.value.code == 146
            assert set(proxy.engine.streams) == {"second"}

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_a_closed_stream_drops_what_its_reader_processes_sent_ahead(cluster):
    """Batches a reader process sent while the merge was stopped (a full bucket nobody reads) are
    held by the stream's shard reader; a closed stream drops them at once. Kept, they waited for
    a full collection, and a churn soak's proxy grew by 1 GiB in three minutes."""
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(upstream=cluster.uri, listen_port=0, stream_idle_teardown_s=0.5),
        )

        def work():
            c = client(proxy_uri(proxy))
            opened = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 1,
                    "name": "stalled",
                    "readerProcesses": 1,
                    "bucketBufferBytes": 1,
                }
            )
            stream = proxy.engine.streams["stalled"]
            for i in range(
                30
            ):  # more batches than the merge's channel holds: the rest wait in the readers
                c.stalled.c.insert_many([{"_id": (i, k), "pad": "x" * 100} for k in range(100)])
                # Read before the next insert, so that each insert is a batch of its own.
                wait_until(
                    lambda i=i: (
                        sum(r.stats.events for r in stream.readers.values()) >= 100 * (i + 1)
                    ),
                    timeout=10,
                    interval=0.005,
                )
            wait_until(lambda: any(r._arrived for r in stream.readers.values()), timeout=30)
            c.admin.command({"killCursors": NS, "cursors": [opened["cursors"][0]["id"]]})
            wait_until(lambda: "stalled" not in proxy.engine.streams, timeout=10)
            wait_until(lambda: not any(r._arrived for r in stream.readers.values()), timeout=10)

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_cursors_of_vanished_consumers_time_out(cluster):
    """A consumer that stops calling getMore without killCursors (a crashed app) loses its cursor
    after the cursor timeout, or after the session timeout if it opened it in a session, as
    mongos would kill it; then the stream is torn down."""
    from buckets.engine import EngineConfig
    from wireproxy.upstream import open_upstream

    config = EngineConfig(cursor_timeout_s=1.0, session_cursor_timeout_s=4.0, idle_teardown_s=0.5)
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(
            functools.partial(
                serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0), engine_config=config
            )
        )
        # No lsid on this raw connection: a session-less cursor.
        raw = await open_upstream("127.0.0.1", proxy.port)
        opened = await raw.command(
            "admin", {"parallelChangeStream": 1, "nBuckets": 3, "name": "abandoned"}
        )
        bare, waiting, kept = (cur["id"] for cur in opened["cursors"])

        def work():
            c = client(proxy_uri(proxy))
            in_session = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "name": "abandoned",
                    "bucket": 0,
                    "resumeAfter": opened["cursors"][0]["postBatchResumeToken"],
                }
            )
            return c, in_session["cursor"]["id"]

        c, session_cursor = await sync(work)

        async def getmore(cid):
            reply = await raw.command(
                "admin", {"getMore": cid, "collection": NS, "maxTimeMS": 0}, check=False
            )
            return reply.get("code")

        waiter = await open_upstream("127.0.0.1", proxy.port)
        nursery.start_soon(
            lambda: waiter.command(
                "admin", {"getMore": waiting, "collection": NS, "maxTimeMS": 5000}
            )
        )
        await poll_until(
            lambda: proxy.engine.cursors[waiting].busy, 5
        )  # parked: an idle bucket answers in ~1 s
        assert await getmore(waiting) == 143  # CursorInUse: one getMore at a time, as mongos
        for _ in range(8):  # 2 s of a consumer that keeps reading
            await trio.sleep(0.25)
            assert await getmore(kept) is None
        assert await getmore(bare) == 43  # CursorNotFound: unused for longer than cursor_timeout_s
        status = await raw.command("admin", {"parallelChangeStreamStatus": 1})
        assert (
            status["cursorsTimedOut"] >= 1
        )  # (`waiting`, whose getMore returned at ~1 s, may be too)

        def session_cursor_outlives_the_cursor_timeout():
            c.admin.command({"getMore": session_cursor, "collection": NS, "maxTimeMS": 0})

        await sync(session_cursor_outlives_the_cursor_timeout)
        await trio.sleep(0.5)
        await waiter.aclose()
        # Every consumer leaves: the cursors time out, then the stream is torn down.
        with trio.fail_after(15):
            while "abandoned" in proxy.engine.streams:
                await trio.sleep(0.2)
        assert proxy.engine.cursors_timed_out == 4
        await raw.aclose()
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def _kill_during_get_more(
    proxy: Any, conn: Any, cid: int, *, after_s: float = 0.0
) -> dict[str, Any]:
    """Run a getMore on `cid` from another connection and, once it runs (plus `after_s`), kill the
    cursor through `conn`: the getMore's code, errmsg, event count and duration."""
    from wireproxy.upstream import open_upstream

    outcome: dict[str, Any] = {}

    async def get_more() -> None:
        waiter = await open_upstream("127.0.0.1", proxy.port)
        started = trio.current_time()
        reply = await waiter.command(
            "admin", {"getMore": cid, "collection": NS, "maxTimeMS": 30_000}, check=False
        )
        outcome.update(
            code=reply.get("code"),
            message=reply.get("errmsg"),
            seconds=trio.current_time() - started,
            events=len(reply.get("cursor", {}).get("nextBatch", [])),
        )
        await waiter.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(get_more)
        await poll_until(lambda: proxy.engine.cursors[cid].busy, 5)
        await trio.sleep(after_s)
        killed = await conn.command("admin", {"killCursors": NS, "cursors": [cid]})
        assert killed["cursorsKilled"] == [cid]
    return outcome


async def test_the_cursor_of_a_new_stream_starts_at_its_start_even_if_events_were_dealt_first(
    cluster, proxy
):
    """The readers of a new stream may deal events before the command that created it makes its
    cursors (tests/integration/test_accelerate.py has the race end to end): made here on purpose,
    the cursor still starts at the stream's start point, with that point as its resume token."""

    def backlog():
        c = client(proxy_uri(proxy))
        start = c.admin.command("ping")["operationTime"]
        c.dealt.c.insert_many([{"i": i} for i in range(500)])
        return start

    start = await sync(backlog)
    engine = proxy.engine
    stream = await engine.stream_set.create(
        "dealt-first", 1, {"nBuckets": 1, "startAtOperationTime": start}
    )
    await poll_until(lambda: stream.buckets[0].end >= 500, 10)
    cur = new_cursor(engine.registry, "", stream, 0, {}, None, None, from_start=True)
    assert cur.last_token == high_water_mark(start)
    events, _ = await cur.next_batch(None, 0)
    assert [bson.decode(ev[EV_RAW])["fullDocument"]["i"] for ev in fields_of(events)] == list(
        range(500)
    )
    engine.registry.drop(cur.cursor_id)


async def test_buckets_attached_at_once_to_a_missing_stream_share_one_stream(cluster, proxy):
    """After a proxy restart, the tasks of a micro-batch each attach their bucket with nBuckets
    and a token at the same moment: one stream is created for all of them (each made its own,
    and the extra ones were never torn down)."""
    from wireproxy.upstream import open_upstream

    def start_time():
        return client(proxy_uri(proxy)).admin.command("ping")["operationTime"]

    token = high_water_mark(await sync(start_time))
    replies: list[Any] = []

    async def attach(i: int) -> None:
        conn = await open_upstream("127.0.0.1", proxy.port)
        replies.append(
            await conn.command(
                "admin",
                {
                    "parallelChangeStream": 1,
                    "name": "restarted",
                    "nBuckets": 4,
                    "bucket": i,
                    "resumeAfter": token,
                },
            )
        )
        await conn.aclose()

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(attach, i)
    ids = [r["cursor"]["id"] for r in replies]
    engine = proxy.engine
    assert {engine.cursors[cid].stream for cid in ids} == {engine.streams["restarted"]}
    for cid in ids:
        engine.registry.drop(cid)


async def test_killing_cursors_and_sessions(cluster, proxy):
    """killCursors interrupts a getMore waiting on the cursor (CursorKilled, as mongos); a
    killCursors naming mongos's cursors too kills those upstream; killSessions closes the engine's
    cursors of those sessions, as the server closes a killed session's cursors."""
    from wireproxy.upstream import open_upstream

    raw = await open_upstream("127.0.0.1", proxy.port)
    opened = await raw.command(
        "admin", {"parallelChangeStream": 1, "nBuckets": 2, "name": "killed"}
    )
    parked, other = (cur["id"] for cur in opened["cursors"])
    outcome = await _kill_during_get_more(proxy, raw, parked)
    # (An idle bucket's getMore returns once its resume point moves, ~1 s: rarely, just before the
    # kill.)
    if outcome["code"] is not None:
        assert (outcome["code"], outcome["message"]) == (
            237,
            "operation was interrupted",
        )  # CursorKilled
        assert outcome["seconds"] < 5

    def work():
        c = client(proxy_uri(proxy))
        c.kc.c.insert_many([{"i": i} for i in range(5)])
        found = c.kc.command({"find": "c", "batchSize": 1})["cursor"]["id"]  # a mongos cursor
        reply = c.admin.command({"killCursors": NS, "cursors": [other, found]})
        assert sorted(reply["cursorsKilled"]) == sorted([other, found]), reply
        with pytest.raises(OperationFailure) as info:
            c.kc.command({"getMore": found, "collection": "c"})
        assert info.value.code == 43

        with c.start_session() as s, c.start_session() as bystander:
            mine = c.admin.command(
                {"parallelChangeStream": 1, "name": "killed", "bucket": 0}, session=s
            )
            theirs = c.admin.command(
                {"parallelChangeStream": 1, "name": "killed", "bucket": 1}, session=bystander
            )
            c.admin.command({"killSessions": [s.session_id]})
            with pytest.raises(OperationFailure) as info:
                c.admin.command(
                    {"getMore": mine["cursor"]["id"], "collection": NS, "maxTimeMS": 0}, session=s
                )
            assert info.value.code == 43
            c.admin.command(
                {"getMore": theirs["cursor"]["id"], "collection": NS, "maxTimeMS": 0},
                session=bystander,
            )

    await sync(work)
    await raw.aclose()


async def test_cursors_of_ended_sessions_are_killed_at_the_next_session_refresh(cluster):
    """endSessions does not kill cursors at once; the server kills those of ended sessions at its
    next session refresh, and so does the engine (every session_refresh_s)."""
    from buckets.engine import EngineConfig

    config = EngineConfig(session_refresh_s=2.0)
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(
            functools.partial(
                serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0), engine_config=config
            )
        )

        def work():
            c = client(proxy_uri(proxy))
            opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "name": "ended"})
            ended, kept = c.start_session(), c.start_session()
            mine = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "name": "ended",
                    "bucket": 0,
                    "resumeAfter": opened["cursors"][0]["postBatchResumeToken"],
                },
                session=ended,
            )
            theirs = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "name": "ended",
                    "bucket": 1,
                    "resumeAfter": opened["cursors"][1]["postBatchResumeToken"],
                },
                session=kept,
            )
            c.admin.command({"endSessions": [ended.session_id]})
            wait_until(lambda: mine["cursor"]["id"] not in proxy.engine.cursors, timeout=10)
            assert theirs["cursor"]["id"] in proxy.engine.cursors
            kept.end_session()

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_a_cursor_killed_while_its_lookups_run_fails_that_getmore(cluster, proxy):
    """fullDocument: updateLookup reads documents through mongos while the getMore runs; a
    killCursors meanwhile interrupts it with CursorKilled instead of letting it return the batch."""
    from wireproxy.upstream import open_upstream, parse_hosts

    def setup():
        c = client(proxy_uri(proxy))
        start = c.admin.command("ping")["operationTime"]
        c.lk.c.insert_one({"_id": 1})
        c.lk.c.update_one({"_id": 1}, {"$set": {"x": 1}})
        return start

    start = await sync(setup)
    raw = await open_upstream("127.0.0.1", proxy.port)
    opened = await raw.command(
        "admin",
        {
            "parallelChangeStream": 1,
            "nBuckets": 1,
            "name": "lookups",
            "fullDocument": "updateLookup",
            "startAtOperationTime": start,
        },
    )
    cid = opened["cursors"][0]["id"]
    direct = await open_upstream(*parse_hosts(cluster.uri)[0])
    await direct.command(
        "admin",
        {
            "configureFailPoint": "failCommand",
            "mode": {"times": 1},
            "data": {"failCommands": ["find"], "blockConnection": True, "blockTimeMS": 3000},
        },
    )
    outcome = await _kill_during_get_more(
        proxy, raw, cid, after_s=0.5
    )  # inside the lookup, held 3 s
    assert (outcome["code"], outcome["events"]) == (237, 0)
    await direct.command("admin", {"configureFailPoint": "failCommand", "mode": "off"})
    await direct.aclose()
    await raw.aclose()


async def test_an_idle_cluster_gets_few_notes_while_a_consumer_waits(cluster, proxy):
    """A consumer waiting on an idle cluster keeps a fresh resume point from about one note a second
    per shard; notes come faster only while events wait on an idle shard (one per round trip)."""

    def work():
        c = client(proxy_uri(proxy))
        opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 1, "name": "idle"})
        window = time.monotonic() + 3
        marks = []
        while time.monotonic() < window:  # a consumer polling an idle bucket for three seconds
            more = c.admin.command(
                {"getMore": opened["cursors"][0]["id"], "collection": NS, "maxTimeMS": 1000}
            )
            assert more["cursor"]["nextBatch"] == []
            marks.append(more["cursor"]["postBatchResumeToken"]["_data"])
        assert len(set(marks)) >= 2  # the resume point kept moving
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "idle"})["streams"][0]
        noops = [s["noops"] for s in status["shards"]]
        assert max(noops) <= 8, noops  # ~1 a second each; fifty a second before
        assert status["topology"]["checks"] <= 8

    await sync(work)


async def test_idle_shards_are_nudged_as_soon_as_events_wait_on_them():
    """A write on one shard while the others idle: nothing would move the idle shards' marks here
    (no periodic noops, readers' getMores that wait an hour), so the event arrives only because
    the merge nudges the idle shards into writing a note."""
    from buckets.engine import EngineConfig

    async with (
        open_cluster(shards=3, periodic_noop_s=3600) as cluster,
        trio.open_nursery() as nursery,
    ):
        proxy = await nursery.start(
            functools.partial(
                serve_proxy,
                ProxyConfig(upstream=cluster.uri, listen_port=0),
                engine_config=EngineConfig(reader_await_ms=3_600_000),
            )
        )

        def work():
            c = client(proxy_uri(proxy))
            c.admin.command("enableSharding", "nudge")
            c.nudge.create_collection("c")  # unsharded: it lives on one shard
            opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 1, "name": "nudged"})
            cid = opened["cursors"][0]["id"]
            c.nudge.c.insert_one({"_id": "hot"})
            got: list[Any] = []

            def arrived() -> bool:
                r = c.admin.command({"getMore": cid, "collection": NS, "maxTimeMS": 300})
                got.extend(r["cursor"]["nextBatch"])
                return any(e.get("documentKey") == {"_id": "hot"} for e in got)

            wait_until(arrived, timeout=30)
            status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "nudged"})[
                "streams"
            ][0]
            assert sum(s["noops"] for s in status["shards"]) >= 2  # the idle shards wrote notes

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_dates_outside_pythons_range_pass_through_the_engine(cluster, proxy):
    """BSON dates span ±292 million years, Python's datetime years 1 to 9999. Such a date as a
    key, in a document, in an update and under a $match is an event like any other (pymongo's
    default decoding would fail the stream)."""
    from bson.codec_options import CodecOptions, DatetimeConversion
    from bson.datetime_ms import DatetimeMS

    def work():
        opts = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)
        c = client(proxy_uri(proxy), datetime_conversion="DATETIME_AUTO")
        direct = client(cluster.uri, datetime_conversion="DATETIME_AUTO")
        start = c.admin.command("ping")["operationTime"]
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 1,
                "startAtOperationTime": start,
                "pipeline": [{"$match": {"operationType": {"$in": ["insert", "update"]}}}],
            }
        )
        early, late = DatetimeMS(-(10**15)), DatetimeMS(10**15)  # 29700 BC, 33658 AD
        c.dt.c.insert_one({"_id": early, "when": late})
        c.dt.c.update_one({"_id": early}, {"$set": {"when": early}})
        end = end_point(c)
        got = drain(c, opened["cursors"][0]["id"], end)
        want = []
        with direct.dt.c.watch(start_at_operation_time=start, max_await_time_ms=200) as stream:
            while len(want) < 2:
                ev = stream.try_next()
                if ev is not None:
                    want.append(ev)
        assert [bson.encode(bson.decode(e.raw, opts)) for e in got] == [
            bson.encode(e) for e in want
        ]
        assert bson.decode(got[1].raw, opts)["updateDescription"]["updatedFields"]["when"] == early

    await sync(work)


async def test_a_match_by_expr_filters_the_events_as_they_are_dealt(proxy):
    """$expr in a parallelChangeStream's $match (here Debezium's kind of size limit, as its
    oversize "skip" mode writes it): the events it drops reach no bucket."""

    def work():
        c = client(proxy_uri(proxy))
        start = c.admin.command("ping")["operationTime"]
        limit = {
            "$expr": {"$lte": [{"$bsonSize": "$fullDocument"}, 40]}
        }  # null (no document) passes
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 2,
                "startAtOperationTime": start,
                "pipeline": [{"$match": limit}],
            }
        )
        c.ex.c.insert_many(
            [{"_id": i, "pad": "x" * (10 * i)} for i in range(4)]
        )  # 26, 36, 46, 56 bytes
        c.ex.c.delete_many({})
        end = end_point(c)
        got = [bson.decode(e.raw) for cur in opened["cursors"] for e in drain(c, cur["id"], end)]
        assert sorted((e["operationType"], e["documentKey"]["_id"]) for e in got) == [
            ("delete", 0),
            ("delete", 1),
            ("delete", 2),
            ("delete", 3),
            ("insert", 0),
            ("insert", 1),
        ]

    await sync(work)


async def test_a_match_that_fails_on_an_event_fails_only_that_events_bucket(proxy):
    """A $match that cannot evaluate an event ($bsonSize of a string) fails the buckets of that
    event's namespace, after their events before it, as a server's stream fails on the event; a
    bucket of other namespaces reads on."""

    def work():
        c = client(proxy_uri(proxy))
        start = c.admin.command("ping")["operationTime"]
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 2,
                "startAtOperationTime": start,
                "name": "bad-match",
                "pipeline": [
                    {"$match": {"$expr": {"$lt": [{"$bsonSize": "$fullDocument.d"}, 99]}}}
                ],
            }
        )
        bad, good = (opened["cursors"][bucket_of(f"ex.{coll}", 2)]["id"] for coll in ("a", "d"))
        c.ex.a.insert_many(
            [{"_id": 1, "d": {}}, {"_id": 2, "d": "not a document"}, {"_id": 3, "d": {}}]
        )
        c.ex.d.insert_many([{"_id": 1, "d": {}}, {"_id": 2, "d": {}}])
        end = end_point(c)
        assert [e["documentKey"]["_id"] for e in drain(c, good, end)] == [1, 2]
        got: list[Any] = []
        with pytest.raises(OperationFailure) as failed:
            for _ in range(50):
                got += c.admin.command({"getMore": bad, "collection": NS, "maxTimeMS": 300})[
                    "cursor"
                ]["nextBatch"]
        assert failed.value.code == 31393, failed.value.details
        assert [e["documentKey"]["_id"] for e in got] == [1]
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "bad-match"})["streams"][
            0
        ]
        assert status["error"] is None
        assert [b["error"] is not None for b in status["buckets"]] == [
            i == bucket_of("ex.a", 2) for i in range(2)
        ]
        c.ex.d.insert_one({"_id": 3, "d": {}})  # the good bucket still gets events
        assert [e["documentKey"]["_id"] for e in drain(c, good, end_point(c))] == [3]

    await sync(work)


def _has_ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")
async def test_a_cluster_on_ipv6_addresses_is_read_through_the_proxy():
    """Hosts as the server writes them, an IPv6 address in brackets ([::1]:port), in the upstream
    URI and in listShards' shard strings: the proxy, its readers (in a reader process) and a
    watch() all reach them. The host list was split at the first colon."""
    async with (
        open_cluster(shards=2, members=2, host="::1") as cluster,
        trio.open_nursery() as nursery,
    ):
        assert cluster.uri.startswith("mongodb://[::1]:")
        proxy = await nursery.start(
            serve_proxy, ProxyConfig(upstream=cluster.uri, listen_host="::1", listen_port=0)
        )

        def work() -> None:
            c = client(f"mongodb://[::1]:{proxy.port}/")
            opened = c.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 2, "readerProcesses": 1}
            )
            c.admin.command("shardCollection", "t.h", key={"_id": "hashed"})
            c.t.h.insert_many([{"_id": i} for i in range(100)])  # on both shards
            end = end_point(c)
            inserted = [
                e["documentKey"]["_id"]
                for cur in opened["cursors"]
                for e in drain(c, cur["id"], end)
                if e["operationType"] == "insert"
            ]
            assert sorted(inserted) == list(range(100))
            status = c.admin.command({"parallelChangeStreamStatus": 1})["streams"][0]
            assert all(s["reconnects"] == 0 for s in status["shards"])

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_a_backlog_dealt_as_event_blocks_equals_the_native_stream_within_small_budgets(
    cluster, proxy
):
    """A backlog's oplog batches (inserts, updates and deletes of ObjectId documents) become
    EventBlocks, which the merge, the buckets and the replies handle as columns; cut by small
    budgets and small batches anywhere inside them, they still give mongos's events, byte for byte,
    and the buckets stay within their budget."""

    def work():
        c = client(proxy_uri(proxy))
        c.admin.command("enableSharding", "blk")
        c.admin.command("shardCollection", "blk.c0", key={"_id": "hashed"})
        start = c.admin.command("ping")["operationTime"]
        for i in range(3):
            c.blk[f"c{i}"].insert_many([{"pad": "z" * 50, "i": j} for j in range(700)])
        # Namespaces taken in turns (c1 and c2 share a shard, and go to buckets 0 and 2 of 4): a
        # block of several kinds, which a cut may leave holding none of some bucket's (that
        # bucket's share of it is then nothing, not an empty block).
        for j in range(250):
            for i in range(3):
                c.blk[f"c{i}"].insert_one({"pad": "y", "j": j})
        c.blk.c0.update_many({}, {"$set": {"i": -1}})
        c.blk.c1.delete_many({})
        end = end_point(c)
        native = native_stream(c, start, end)
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 4,
                "name": "blocks",
                "startAtOperationTime": start,
                "bucketBufferBytes": 60_000,
                "showExpandedEvents": True,
            }
        )

        # The buckets drained in turns: a full bucket holds the merge back, and the others with it.
        cursors = opened["cursors"]
        got: list[list[RawBSONDocument]] = [list(cursor["firstBatch"]) for cursor in cursors]
        done = [False] * len(cursors)
        while not all(done):
            for i, cursor in enumerate(cursors):
                if done[i]:
                    continue
                r = c.admin.command(
                    {"getMore": cursor["id"], "collection": NS, "maxTimeMS": 10, "batchSize": 13},
                    codec_options=RAW,
                )
                got[i] += r["cursor"]["nextBatch"]
                done[i] = key(r["cursor"]["postBatchResumeToken"]) >= end
            status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "blocks"})[
                "streams"
            ][0]
            assert all(b["bytes"] <= 60_000 for b in status["buckets"])
        for i, events in enumerate(got):
            assert [key(e["_id"]) for e in events] == sorted(key(e["_id"]) for e in events)
            got[i] = [e for e in events if key(e["_id"]) <= end]
        union = sorted((e for bucket in got for e in bucket), key=lambda e: key(e["_id"]))
        assert len([e for e in native if e["ns"]["db"] == "blk"]) >= 2800
        assert [e.raw for e in union] == [e.raw for e in native]
        # The shards' read counts count a block's events, not the block.
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "blocks"})["streams"][0]
        assert sum(s["events"] for s in status["shards"]) >= len(native)

    await sync(work)


async def test_a_txn_prepared_before_the_start_committed_while_readers_stream_arrives_whole(
    cluster, proxy
):
    """A stream opened between a cross-shard transaction's prepare and its commit: the commit
    entry comes in a batch its member streams (the readers' exhaust getMore), and the prepared
    writes, before the stream's start, are read back by prevOpTime on a connection of their own
    (the streaming one runs nothing else). Every write arrives, once."""
    import threading

    def work() -> None:
        c, direct = client(proxy_uri(proxy)), client(cluster.uri)
        direct.admin.command("shardCollection", "tx.h", key={"_id": "hashed"})
        direct.admin.command("configureFailPoint", "hangBeforeWritingDecision", mode="alwaysOn")

        def commit() -> None:
            with direct.start_session() as s:
                s.start_transaction()
                direct.tx.h.insert_many([{"_id": 1000 + j} for j in range(8)], session=s)
                s.commit_transaction()

        worker = threading.Thread(target=commit)
        worker.start()
        try:
            wait_until(
                lambda: cluster.mongos.commit_decisions, timeout=20
            )  # prepared on every shard
            start = direct.admin.command("ping")["operationTime"]
            opened = c.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 1, "startAtOperationTime": start}
            )
            cursor_id = opened["cursors"][0]["id"]
            c.admin.command(
                {"getMore": cursor_id, "collection": NS, "maxTimeMS": 300}
            )  # the readers stream now
        finally:
            direct.admin.command("configureFailPoint", "hangBeforeWritingDecision", mode="off")
            worker.join(30)
        events = [bson.decode(e.raw) for e in drain(c, cursor_id, end_point(direct))]
        assert sorted(
            e["documentKey"]["_id"] for e in events if e["operationType"] == "insert"
        ) == list(range(1000, 1008))

    await sync(work)
