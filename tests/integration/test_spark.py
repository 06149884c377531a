"""bucketspark with real Spark in local mode: one task per bucket, repeatable reads, checkpoint
restart without loss or duplicates in the target, DDL replayed. One shared session (a session
costs seconds to start)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import bson
import pymongo
import pytest
from pymongo.errors import NetworkTimeout

pyspark = pytest.importorskip("pyspark")

from buckets.bucketing import bucket_of  # noqa: E402
from bucketspark.client import (  # noqa: E402
    StreamSpec,
    client_for,
    open_stream,
    plan_end,
    read_bucket,
)
from bucketspark.session import spark_session  # noqa: E402
from bucketspark.sink import replicate_batch  # noqa: E402
from bucketspark.verify import document_differences  # noqa: E402
from demo.demo import converged  # noqa: E402
from demo.embedded import embedded_environment  # noqa: E402
from tests.conftest import free_port, wait_until  # noqa: E402

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def env() -> Any:
    with embedded_environment(shards=3) as e:
        yield e


@pytest.fixture(scope="module")
def spark() -> Any:
    session = spark_session("bucketspark-tests", master="local[2]")
    yield session
    session.stop()


def test_batch_read_one_task_per_bucket_and_repeatable(env: Any, spark: Any) -> None:
    c = client_for(env.proxy_uri)
    try:
        start = c.admin.command("ping")["operationTime"]
        c.bt.a.insert_many([{"_id": i} for i in range(300)])
        c.bt.b.insert_many([{"_id": i} for i in range(200)])
        c.bt2.c.insert_many([{"_id": i} for i in range(100)])
    finally:
        c.close()
    reader = (
        spark.read.format("parallelchangestream")
        .option("uri", env.proxy_uri)
        .option("nBuckets", "4")
        .option("name", "batch1")
        .option("startAtOperationTime", f"{start.time},{start.inc}")
        .option("bucketBufferBytes", str(8 << 20))
    )
    df = reader.load()
    assert df.rdd.getNumPartitions() == 4
    c = client_for(env.proxy_uri)
    try:  # engine options reach the stream the proxy created
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "batch1"})["streams"][0]
        assert {b["limitBytes"] for b in status["buckets"]} == {8 << 20}
    finally:
        c.close()
    rows = df.filter("operationType = 'insert'").collect()
    assert len(rows) == 600
    per_partition = df.rdd.mapPartitionsWithIndex(
        lambda i, it: [(i, sorted({r["bucket"] for r in it}))]
    ).collect()
    assert all(buckets in ([], [i]) for i, buckets in per_partition)
    # Same (start, end] twice: the same rows, in the same order per bucket.
    spec = StreamSpec(env.proxy_uri, "batch1", 4)
    c = client_for(env.proxy_uri)
    try:
        starts = open_stream(c, spec)
        del starts
        c.admin.command("appendOplogNote", data={"t": 1})
        after = [r["token"] for r in df.orderBy("token").limit(1).collect()]
        end = plan_end(c, spec, [after[0]] * 4, None)
        first = [list(read_bucket(c, spec, b, after[0], end)) for b in range(4)]
        second = [list(read_bucket(c, spec, b, after[0], end)) for b in range(4)]
        assert [[e.raw for e in b] for b in first] == [[e.raw for e in b] for b in second]
    finally:
        c.close()


def test_a_read_with_the_connectors_options_gets_only_that_collections_events(
    env: Any, spark: Any
) -> None:
    """connection.uri, database and collection (the MongoDB Spark connector's names) and a start
    time in the connector's timestamp mode, as mongosh prints it: only filt.keep's events."""
    c = client_for(env.proxy_uri)
    try:
        start = c.admin.command("ping")["operationTime"]
        c.filt.keep.insert_many([{"_id": i} for i in range(30)])
        c.filt.other.insert_many([{"_id": i} for i in range(20)])
        c.filt2.keep.insert_many([{"_id": i} for i in range(10)])
        c.filt.keep.update_one({"_id": 0}, {"$set": {"v": 1}})
    finally:
        c.close()
    df = (
        spark.read.format("parallelchangestream")
        .option("connection.uri", env.proxy_uri)
        .option("database", "filt")
        .option("collection", "keep")
        .option("nBuckets", "2")
        .option("name", "connector-options")
        .option("change.stream.startup.mode", "timestamp")
        .option(
            "change.stream.startup.mode.timestamp.start.at.operation.time",
            f"Timestamp({start.time}, {start.inc})",
        )
        .load()
    )
    rows = df.select("db", "coll", "operationType").collect()
    assert {(r["db"], r["coll"]) for r in rows} == {("filt", "keep")}
    kinds = sorted(r["operationType"] for r in rows if r["operationType"] in ("insert", "update"))
    assert kinds == ["insert"] * 30 + ["update"]
    # change.stream.publish.full.document.only: rows carry the documents, updates' looked up.
    docs = (
        spark.read.format("parallelchangestream")
        .option("connection.uri", env.proxy_uri)
        .option("database", "filt")
        .option("collection", "keep")
        .option("nBuckets", "2")
        .option("name", "connector-documents")
        .option("startAtOperationTime", f"{start.time},{start.inc}")
        .option("change.stream.publish.full.document.only", "true")
        .load()
    )
    bodies = sorted(
        (bson.decode(r["event"]) for r in docs.select("event").collect()), key=lambda d: d["_id"]
    )
    assert bodies[:2] == [{"_id": 0}, {"_id": 0, "v": 1}] and len(bodies) == 31


def test_a_query_on_a_backlog_reads_events_in_its_first_micro_batch(env: Any, spark: Any) -> None:
    """The proxy opens the stream when the query plans its first micro-batch, and that plan
    waits briefly for the shard readers' first reads (bucketspark.source `_first_end`): the
    batch that pays Spark's start-up carries events, rather than none."""
    c = client_for(env.proxy_uri)
    try:
        start = c.admin.command("ping")["operationTime"]
        c.first.backlog.insert_many([{"_id": i} for i in range(300)])
        query = (
            spark.readStream.format("parallelchangestream")
            .option("uri", env.proxy_uri)
            .option("nBuckets", "2")
            .option("name", "first-batch")
            .option("startAtOperationTime", f"{start.time},{start.inc}")
            .load()
            .writeStream.format("memory")
            .queryName("first_batch")
            .start()
        )
        try:
            wait_until(lambda: query.lastProgress is not None, timeout=90)
            first = query.recentProgress[0]
            assert first["batchId"] == 0 and first["numInputRows"] > 0
        finally:
            query.stop()
    finally:
        c.close()


def test_streaming_replication_with_checkpoint_restart_and_ddl(
    env: Any, spark: Any, tmp_path: Any
) -> None:
    source, target = client_for(env.proxy_uri), client_for(env.target.uri)
    checkpoint = str(tmp_path / "ckpt")

    def start_query() -> Any:
        df = (
            spark.readStream.format("parallelchangestream")
            .option("uri", env.proxy_uri)
            .option("nBuckets", "4")
            .option("name", "repl")
            .option("maxEventsPerTrigger", "400")
            .load()
        )
        return (
            df.writeStream.foreachBatch(replicate_batch(env.target.uri))
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="500 milliseconds")
            .start()
        )

    try:
        query = start_query()
        wait_until(lambda: query.lastProgress is not None, timeout=90)
        source.rs.items.insert_many([{"_id": i, "v": i} for i in range(500)])
        source.rs.items.create_index("v", name="v_idx")
        source.rs.items.update_many({"v": {"$lt": 100}}, {"$set": {"low": True}})
        wait_until(lambda: target.rs.items.count_documents({}) >= 200, timeout=90)
        # Crash-stop the query mid-stream (its checkpoint is all that survives), write more,
        # restart.
        query.stop()
        source.rs.items.delete_many({"v": {"$gte": 450}})
        source.rs.other.insert_many([{"_id": i} for i in range(50)])
        source.rs.command({"collMod": "items", "validationLevel": "moderate"})
        source.admin.command({"renameCollection": "rs.other", "to": "rs.renamed"})
        _awkward_updates(source.rs.items)
        with source.start_session() as s:  # replayed as one target transaction per bucket
            s.with_transaction(
                lambda s: (
                    source.rs.items.update_one({"_id": 1}, {"$set": {"paid": True}}, session=s),
                    source.rs.ledger.insert_one({"_id": 1, "amount": 5}, session=s),
                )
            )
        query = start_query()
        wait_until(lambda: converged(source, target, ("rs",)), timeout=90)
        assert target.rs.items.count_documents({"low": True}) == 100
        assert (
            target.rs.items.find_one({"_id": 1})["paid"]
            and target.rs.ledger.count_documents({}) == 1
        )
        assert "v_idx" in [ix["name"] for ix in target.rs.items.list_indexes()]
        assert (
            "renamed" in target.rs.list_collection_names()
            and "other" not in target.rs.list_collection_names()
        )
        assert document_differences(source, target, ("rs",)) == []  # byte for byte, by _id
        progress = query.recentProgress
        assert all(p["numInputRows"] <= 400 for p in progress)  # admission control
        query.stop()
    finally:
        source.close()
        target.close()


def _awkward_updates(items: Any) -> None:
    """Fields whose names hold a dot or start with $ (set with $setField, as the manual's "Field
    Names with Periods and Dollar Signs" says), also inside a subdocument; an array cut short
    and changed in one update; numeric keys beside array indices."""

    def set_field(name: str, value: Any, on: Any = "$$ROOT") -> dict[str, Any]:
        return {"$setField": {"field": {"$literal": name}, "input": on, "value": value}}

    items.update_many(
        {"_id": {"$in": [2, 3, 4]}},
        {"$set": {"pad": "p" * 300, "arr": list(range(30)), "sub": {"a": 1}, "n": {"0": 0}}},
    )
    items.update_one({"_id": 2}, [{"$replaceWith": set_field("hosts.example.com", 1)}])
    items.update_one({"_id": 2}, [{"$set": {"sub": set_field("db.example.com", True, "$sub")}}])
    items.update_one({"_id": 3}, [{"$replaceWith": set_field("$price", {"$literal": "$5"})}])
    cut = {"$concatArrays": [[-1], {"$slice": ["$arr", 1, 9]}]}  # 30 to 10, the first changed
    items.update_one({"_id": 3}, [{"$set": {"arr": cut}}])
    items.update_one({"_id": 4}, {"$set": {"n.1": "one", "arr.2": "two"}})
    items.delete_one({"_id": 300})


def test_a_query_restarted_with_another_nbuckets_carries_on_from_its_checkpoint(
    env: Any, spark: Any, tmp_path: Any
) -> None:
    """Stopped with 2 buckets and restarted on the same checkpoint with 3: every insert arrives
    once, those after the restart in their namespace's bucket of 3."""
    checkpoint = str(tmp_path / "ckpt-rebucket")
    # Rows by batch id, (nBuckets of the run, namespace, _id, bucket): a batch stopped before its
    # commit is run again at the restart (under the new count), replacing its rows, as an
    # idempotent sink would.
    batches: dict[int, list[tuple[int, str, int, int]]] = {}

    def seen() -> list[tuple[int, str, int, int]]:
        return [row for rows in batches.values() for row in rows]

    colls = ["rb.a", "rb.b", "rb.g"]  # rb.a and rb.b share bucket 1 of 2; of 3, each has its own

    def start_query(n: int) -> Any:
        df = (
            spark.readStream.format("parallelchangestream")
            .option("uri", env.proxy_uri)
            .option("nBuckets", str(n))
            .option("name", "rebucket")
            .load()
        )

        def collect(batch: Any, batch_id: int) -> None:
            rows = (
                batch.filter("operationType = 'insert'")
                .select("db", "coll", "documentKey", "bucket")
                .collect()
            )
            batches[batch_id] = [
                (
                    n,
                    f"{r['db']}.{r['coll']}",
                    int(json.loads(r["documentKey"])["_id"]["$numberInt"]),
                    r["bucket"],
                )
                for r in rows
            ]

        return (
            df.writeStream.foreachBatch(collect)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="300 milliseconds")
            .start()
        )

    def insert(ids: range) -> None:
        c = client_for(env.proxy_uri)
        try:
            for ns in colls:
                db, coll = ns.split(".")
                c[db][coll].insert_many([{"_id": i} for i in ids])
        finally:
            c.close()

    query = start_query(2)
    wait_until(lambda: query.lastProgress is not None, timeout=90)
    insert(range(100))
    wait_until(lambda: len(seen()) >= 300, timeout=90)
    query.stop()
    insert(range(100, 150))  # while no query runs
    query = start_query(3)
    insert(range(150, 200))
    wait_until(lambda: len(seen()) >= 600, timeout=90)
    query.stop()
    c = client_for(env.proxy_uri)
    try:  # the proxy reopened the stream of that name with 3 buckets
        assert (
            c.admin.command({"parallelChangeStreamStatus": 1, "name": "rebucket"})["streams"][0][
                "nBuckets"
            ]
            == 3
        )
    finally:
        c.close()
    assert sorted((ns, i) for _, ns, i, _ in seen()) == sorted(
        (ns, i) for ns in colls for i in range(200)
    )
    assert all(b == bucket_of(ns, n) for n, ns, _, b in seen())
    assert {n for n, _, i, _ in seen() if i >= 100} == {3}
    assert (
        len({bucket_of(ns, 2) for ns in colls}) == 2
        and len({bucket_of(ns, 3) for ns in colls}) == 3
    )


def test_a_checkpoint_whose_buckets_stand_apart_refuses_another_nbuckets(
    env: Any, spark: Any, tmp_path: Any
) -> None:
    """A checkpoint started from per-bucket tokens that differ (startTokens of a batch read never
    evened out) can't be dealt anew: the error says so before any batch runs."""
    from bucketspark.source import Options, _StreamReader

    reader = _StreamReader(Options({"uri": env.proxy_uri, "nBuckets": "3", "name": "apart"}))
    with pytest.raises(ValueError, match="nBuckets=2 and its buckets stand at different tokens"):
        reader.partitions(
            {"nBuckets": 2, "name": "apart", "tokens": ["8201", "8202"]},
            {"nBuckets": 2, "name": "apart", "tokens": ["8203", "8203"]},
        )


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("nBucket", "8", "unknown option 'nbucket'"),
        (
            "showExpandedEvents",
            "ture",
            "option showExpandedEvents must be true or false, not 'ture'",
        ),
        ("nBuckets", "2000", "option nBuckets must be an integer between 1 and 1024, not '2000'"),
    ],
)
def test_a_misspelt_or_malformed_option_fails_the_query_by_name(
    env: Any, spark: Any, option: str, value: str, message: str
) -> None:
    """Spark passes any option name through: a typo (nBucket) must not quietly run with 4 buckets,
    nor a mistyped boolean read as false."""
    df = (
        spark.read.format("parallelchangestream")
        .option("uri", env.proxy_uri)
        .option("name", "typo")
        .option(option, value)
        .load()
    )
    with pytest.raises(Exception, match=f"(?i){message}"):
        df.collect()


def test_driver_killed_with_sigkill_resumes_from_its_checkpoint(env: Any, tmp_path: Any) -> None:
    """The replication job (`pcs-replicate`) in its own process, killed -9 mid-stream and started
    again with the same checkpoint: the target ends equal to the source, updates ($inc) applied
    once."""
    source, target = client_for(env.proxy_uri), client_for(env.target.uri)
    start = source.admin.command("ping")["operationTime"]
    cmd = [
        sys.executable,
        "-m",
        "bucketspark.replicate",
        "--proxy",
        env.proxy_uri,
        "--target",
        env.target.uri,
        "--checkpoint",
        str(tmp_path / "ckpt-kill"),
        "--name",
        "kill9",
        "--start",
        f"{start.time},{start.inc}",
        "--max-events-per-trigger",
        "300",
        "--trigger-s",
        "0.2",
    ]

    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        source.k9.items.insert_many([{"_id": i, "n": 0} for i in range(3000)])
        for _ in range(3):
            source.k9.items.update_many({"_id": {"$lt": 500}}, {"$inc": {"n": 1}})
        wait_until(lambda: target.k9.items.count_documents({}) >= 300)
        job.kill()  # SIGKILL: no cleanup; the checkpoint is all that survives, mid-stream
        job.wait()
        assert target.k9.items.count_documents({}) < 3000, "the kill should land mid-stream"
        source.k9.items.delete_many({"_id": {"$gte": 2900}})
        source.k9.more.insert_many([{"_id": i} for i in range(100)])
        job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: converged(source, target, ("k9",)))
        assert target.k9.items.count_documents({"n": 3}) == 500
    finally:
        job.kill()
        job.wait()
        source.close()
        target.close()


def test_pcs_replicate_exits_non_zero_when_its_query_fails_on_the_configured_master(
    tmp_path: Any,
) -> None:
    """A proxy that cannot be reached fails the query: the job says why on stderr and exits 1
    (not 0, which a scheduler would take for success). The master comes from Spark's own
    settings (here the MASTER variable spark-submit reads), not from the job."""
    proxy = f"mongodb://127.0.0.1:{free_port()}/?serverSelectionTimeoutMS=300&connectTimeoutMS=300"
    cmd = [
        sys.executable,
        "-m",
        "bucketspark.replicate",
        "--proxy",
        proxy,
        "--target",
        "mongodb://127.0.0.1:1/",
        "--checkpoint",
        str(tmp_path / "ckpt-fail"),
        "--trigger-s",
        "0.2",
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "MASTER": "local[1]"}
    )
    assert "Spark master local[1]" in done.stdout, done.stdout
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "pcs-replicate: the replication query failed" in done.stderr
    assert "ServerSelectionTimeoutError" in done.stderr


def test_a_batch_with_several_cross_bucket_events_replays_in_order(env: Any, spark: Any) -> None:
    """Two renames and a dropDatabase in one micro-batch: the buckets they are in stop before
    each, the driver applies them one by one, and every namespace ends as on the source."""
    source, target = client_for(env.proxy_uri), client_for(env.target.uri)
    try:
        start = source.admin.command("ping")["operationTime"]
        source.xb.a.insert_many([{"_id": i} for i in range(10)])
        source.xb2.z.insert_many([{"_id": i} for i in range(5)])
        source.xb.other.insert_many(
            [{"_id": i} for i in range(20)]
        )  # a bucket that may run through
        source.admin.command({"renameCollection": "xb.a", "to": "xb.b"})
        source.xb.b.insert_many([{"_id": i} for i in range(10, 15)])
        source.xb.a.insert_one({"_id": "recreated"})
        source.drop_database("xb2")
        source.xb2.z.insert_one({"_id": "after the drop"})
        source.admin.command({"renameCollection": "xb.b", "to": "xb.c"})
        source.xb.c.update_one({"_id": 0}, {"$set": {"last": True}})
        df = (
            spark.read.format("parallelchangestream")
            .option("uri", env.proxy_uri)
            .option("nBuckets", "4")
            .option("name", "barriers")
            .option("startAtOperationTime", f"{start.time},{start.inc}")
            .load()
        )
        applied: dict[int, int] = {}
        replicate_batch(env.target.uri, lambda epoch, counts: applied.update(counts))(df, 0)
        assert converged(source, target, ("xb", "xb2"))
        assert sorted(target.xb.list_collection_names()) == ["a", "c", "other"]
        assert target.xb.c.find_one({"_id": 0}) == {"_id": 0, "last": True}
        assert target.xb2.z.count_documents({}) == 1
        assert (
            sum(applied.values()) >= 55
        )  # every event, a cross-bucket one once per bucket it is in
    finally:
        source.close()
        target.close()


def test_a_hot_collection_bucketed_by_document_key_replicates_with_ddl_as_a_barrier(
    env: Any, spark: Any
) -> None:
    """bucketBy documentKey: one collection's events spread over the 4 tasks, and its DDL (in
    every bucket) is applied once, between what came before and after it in every bucket: a
    drop followed by the same _ids inserted again, and an index, end as on the source."""
    source, target = client_for(env.proxy_uri), client_for(env.target.uri)
    try:
        start = source.admin.command("ping")["operationTime"]
        source.dk.hot.insert_many([{"_id": i, "v": 0} for i in range(200)])
        source.dk.hot.update_many({}, {"$set": {"v": 1}})
        source.dk.hot.drop()
        source.dk.hot.insert_many([{"_id": i, "again": True} for i in range(50)])
        source.dk.hot.create_index("again", name="again_idx")
        source.dk.hot.update_many({"_id": {"$lt": 10}}, {"$set": {"last": True}})
        df = (
            spark.read.format("parallelchangestream")
            .option("uri", env.proxy_uri)
            .option("nBuckets", "4")
            .option("bucketBy", "documentKey")
            .option("name", "by-document")
            .option("startAtOperationTime", f"{start.time},{start.inc}")
            .load()
        )
        per_bucket = {
            r["bucket"]: r["count"]
            for r in df.filter("operationType = 'insert'").groupBy("bucket").count().collect()
        }
        assert len(per_bucket) == 4 and max(per_bucket.values()) <= 0.4 * 250, per_bucket
        replicate_batch(env.target.uri, bucket_by="documentKey")(df, 0)
        assert converged(source, target, ("dk",))
        assert document_differences(source, target, ("dk",)) == []
        assert (
            target.dk.hot.count_documents({}) == 50
            and target.dk.hot.count_documents({"last": True}) == 10
        )
        assert "again_idx" in [ix["name"] for ix in target.dk.hot.list_indexes()]
    finally:
        source.close()
        target.close()


def test_a_checkpoint_of_another_bucket_by_is_dealt_anew_only_from_one_token(
    env: Any, spark: Any
) -> None:
    """bucketBy is part of the offsets: a checkpoint by namespace whose buckets stand apart can't
    go on by documentKey."""
    from bucketspark.source import Options, _StreamReader

    reader = _StreamReader(
        Options({"uri": env.proxy_uri, "nBuckets": "2", "name": "modes", "bucketBy": "documentKey"})
    )
    with pytest.raises(
        ValueError,
        match="different tokens; it was dealt by namespace and the query asks "
        "for nBuckets=2 by documentKey",
    ):
        reader.partitions(
            {"nBuckets": 2, "name": "modes", "tokens": ["8201", "8202"]},
            {"nBuckets": 2, "name": "modes", "tokens": ["8203", "8203"]},
        )


def test_a_task_fails_rather_than_hangs_on_a_proxy_that_stops_answering(env: Any) -> None:
    """A Spark task's reads have a socket timeout (pymongo waits forever by default): against a
    proxy that hangs (here SIGSTOPped: its sockets open, nothing answered) the task fails with a
    network timeout, for Spark to retry, instead of holding the micro-batch for good. The uri's
    own options win over the task's defaults."""
    default = client_for("mongodb://127.0.0.1:1/")
    assert default.options.pool_options.socket_timeout == 120
    default.close()
    port = free_port()
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wireproxy",
            "--upstream",
            env.source.uri,
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stderr=subprocess.DEVNULL,
    )
    uri = (
        f"mongodb://127.0.0.1:{port}/?socketTimeoutMS=1500&connectTimeoutMS=1500"
        "&serverSelectionTimeoutMS=3000"
    )
    c = client_for(uri)
    try:
        assert c.options.pool_options.socket_timeout == 1.5
        wait_until(lambda: _answers(c), 30, 0.2)
        spec = StreamSpec(uri=uri, name="hung-proxy", n_buckets=1)
        start = open_stream(c, spec)[0]
        c.hung.c.insert_one({"_id": 1})
        wait_until(lambda: plan_end(c, spec, [start], None) > start, 30, 0.1)  # one event to read
        end = plan_end(c, spec, [start], None)
        proxy.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        with pytest.raises(NetworkTimeout):
            list(read_bucket(c, spec, 0, start, end))
        assert time.monotonic() - began < 30
    finally:
        proxy.send_signal(signal.SIGCONT)
        proxy.kill()
        proxy.wait()
        c.close()


def _answers(c: Any) -> bool:
    try:
        c.admin.command("ping")
        return True
    except pymongo.errors.PyMongoError:
        return False
