"""bucketBy: "documentKey" deals one collection over every bucket, each document in one bucket in
order, DDL in every bucket (buckets/bucketing.py has the contract); real simcluster, proxy and
pymongo (tests/unit/test_bucket_by.py has the bucket function)."""

from __future__ import annotations

import time
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from pymongo.errors import OperationFailure

import buckets.streams as streams_module
from buckets.bucketing import bucket_of_document
from mongoformats.change_events import RAW
from mongoformats.resume_token import token_from_key
from tests.conftest import client, proxy_uri, sync, wait_until
from tests.integration.test_engine import NS, end_point, key, native_stream

N = 4


def _drain_all(
    c: Any, cursor_ids: list[int], end: bytes, timeout: float = 60
) -> list[list[RawBSONDocument]]:
    """getMore round-robin on every bucket until each passes `end` (none is left to fill up)."""
    out: list[list[RawBSONDocument]] = [[] for _ in cursor_ids]
    done = [False] * len(cursor_ids)
    deadline = time.monotonic() + timeout
    while not all(done):
        assert time.monotonic() < deadline, "buckets did not reach the end point in time"
        for i, cid in enumerate(cursor_ids):
            if done[i]:
                continue
            r = c.admin.command(
                {"getMore": cid, "collection": NS, "maxTimeMS": 200}, codec_options=RAW
            )
            out[i] += [e for e in r["cursor"]["nextBatch"] if key(e["_id"]) <= end]
            done[i] = key(r["cursor"]["postBatchResumeToken"]) >= end
    return out


def _hot_workload(c: Any) -> None:
    """One hot sharded collection: inserts, three updates each, deletes, a transaction over several
    documents, an upsert and DDL in the middle."""
    c.admin.command("shardCollection", "h.hot", key={"_id": "hashed"})
    c.h.hot.insert_many([{"_id": i, "v": 0} for i in range(200)])
    for round_ in range(1, 4):
        for i in range(200):
            c.h.hot.update_one({"_id": i}, {"$set": {"v": round_}})
    c.h.hot.create_index("v")
    with c.start_session() as s:
        s.with_transaction(
            lambda s: [
                c.h.hot.update_one({"_id": i}, {"$set": {"v": 4}}, session=s)
                for i in range(0, 200, 25)
            ]
        )
    c.h.hot.update_one({"_id": 1000}, {"$set": {"v": 1}}, upsert=True)
    c.h.hot.update_one({"_id": 1000}, {"$set": {"v": 2}}, upsert=True)
    c.h.hot.delete_many({"_id": {"$lt": 20}})


async def test_one_hot_collection_spreads_over_every_bucket(cluster, proxy):
    """Over 4 buckets no bucket holds over 40% of the events; each document's events are in one
    bucket (its bucket_of_document) in mongos's order, upserts included; DDL (createIndexes) is in
    every bucket with its token; a transaction is split by document, each event carrying its
    lsid and txnNumber, and the buckets hold all of it."""

    def work():
        c = client(proxy_uri(proxy))
        start = c.admin.command("ping")["operationTime"]
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": N,
                "name": "hot",
                "bucketBy": "documentKey",
                "showExpandedEvents": True,
                "startAtOperationTime": start,
            }
        )
        assert opened["bucketBy"] == "documentKey"
        _hot_workload(c)
        end = end_point(c)
        per_bucket = _drain_all(c, [cur["id"] for cur in opened["cursors"]], end)
        dml = [[e for e in evs if "documentKey" in e] for evs in per_bucket]
        counts = [len(d) for d in dml]
        total = sum(counts)
        assert total == 200 * 4 + 8 + 2 + 20 and max(counts) <= 0.4 * total, counts
        native = native_stream(client(cluster.uri), start, end)
        order = {key(e["_id"]): i for i, e in enumerate(native)}
        by_doc: dict[Any, list[tuple[int, int]]] = {}
        for b, evs in enumerate(dml):
            for e in evs:
                doc = e["documentKey"]["_id"]
                assert b == bucket_of_document("h.hot", doc, N)
                by_doc.setdefault(doc, []).append((b, order[key(e["_id"])]))
        for doc, seen in by_doc.items():
            assert [i for _, i in seen] == sorted(i for _, i in seen), (
                f"document {doc} out of order"
            )
        assert [bson.decode(e.raw) for e in native if "documentKey" in e] == sorted(
            (bson.decode(e.raw) for d in dml for e in d), key=lambda e: order[key(e["_id"])]
        )
        # createIndexes (one per shard holding the collection, as on mongos) in every bucket alike
        ddl = [
            [key(e["_id"]) for e in evs if e["operationType"] == "createIndexes"]
            for evs in per_bucket
        ]
        native_ddl = [key(e["_id"]) for e in native if e["operationType"] == "createIndexes"]
        assert native_ddl and all(t == native_ddl for t in ddl)
        in_txn = [e for d in dml for e in d if "txnNumber" in e]
        assert len(in_txn) == 8 and all("lsid" in e for e in in_txn)
        assert len({b for b, evs in enumerate(dml) for e in evs if "txnNumber" in e}) > 1  # split
        upserted = [
            e["operationType"]
            for e in dml[bucket_of_document("h.hot", 1000, N)]
            if e["documentKey"]["_id"] == 1000
        ]
        assert upserted == ["insert", "update"]
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "hot"})["streams"][0]
        assert status["bucketBy"] == "documentKey"

    await sync(work)


async def test_resume_and_replay_from_bucket_tokens_by_document(cluster, proxy):
    """Bucket tokens of a documentKey stream resume it (a new stream from a list of tokens, as
    after a proxy restart) and, once the bucket no longer holds them, a replay re-reads the oplogs
    for that bucket alone: nothing lost, nothing twice, per-document order kept."""

    def work():
        c = client(proxy_uri(proxy))
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": N,
                "name": "keys",
                "bucketBy": "documentKey",
                "bucketBufferBytes": 20_000,
            }
        )
        c.k.c.insert_many([{"_id": i, "pad": "p" * 100} for i in range(300)])
        c.k.c.update_many({}, {"$set": {"v": 1}})
        end = end_point(c)
        per_bucket = _drain_all(c, [cur["id"] for cur in opened["cursors"]], end)
        assert sum(map(len, per_bucket)) == 600
        for b, evs in enumerate(per_bucket):
            assert [
                e["operationType"]
                for e in evs
                if e["documentKey"]["_id"] == evs[0]["documentKey"]["_id"]
            ] == ["insert", "update"]
            assert all(bucket_of_document("k.c", e["documentKey"]["_id"], N) == b for e in evs)
        # Resume a new stream from each bucket's 10th token.
        tokens = [bson.decode(evs[9]["_id"].raw) for evs in per_bucket]
        resumed = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": N,
                "name": "keys2",
                "bucketBy": "documentKey",
                "resumeAfter": tokens,
            }
        )
        again = _drain_all(c, [cur["id"] for cur in resumed["cursors"]], end)
        assert [[e.raw for e in evs] for evs in again] == [
            [e.raw for e in evs[10:]] for evs in per_bucket
        ]
        # The 20 KB buckets of "keys" no longer hold their first events: attaching replays.
        b = 2
        # (Counted from here: a bucket that fell behind while the round-robin reader waited on
        # the others was replayed too, buckets/catch_up.py.)
        before = c.admin.command({"parallelChangeStreamStatus": 1, "name": "keys"})["streams"][0][
            "replays"
        ]
        att = c.admin.command(
            {
                "parallelChangeStream": 1,
                "name": "keys",
                "bucket": b,
                "resumeAfter": bson.decode(per_bucket[b][0]["_id"].raw),
            },
            codec_options=RAW,
        )
        replayed = _drain_all(c, [att["cursor"]["id"]], end)[0]
        assert [e.raw for e in replayed] == [e.raw for e in per_bucket[b][1:]]
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "keys"})["streams"][0]
        assert status["replays"] == before + 1

    await sync(work)


async def test_bucket_by_is_checked_and_part_of_a_streams_identity(cluster, proxy, monkeypatch):
    """bucketBy is a string (TypeMismatch, 14) naming a mode (BadValue, 2). Reopening a named
    stream with another bucketBy is refused while its cursors are read (117), then reopens it from
    a common token, dealt the new way."""
    monkeypatch.setattr(streams_module, "CURSOR_IN_USE_S", 0.5)

    def work():
        c = client(proxy_uri(proxy))
        for value, code in ((1, 14), (True, 14), ("bogus", 2), ("documentkey", 2)):
            with pytest.raises(OperationFailure) as info:
                c.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "bucketBy": value})
            assert info.value.code == code, value
        opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": N, "name": "mode"})
        assert opened["bucketBy"] == "namespace"
        c.m.c.insert_many([{"_id": i} for i in range(40)])
        end = end_point(c)
        _drain_all(c, [cur["id"] for cur in opened["cursors"]], end)
        common = token_from_key(end)
        with pytest.raises(OperationFailure) as info:
            c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": N,
                    "name": "mode",
                    "bucketBy": "documentKey",
                    "resumeAfter": common,
                }
            )
        assert info.value.code == 117
        c.m.c.insert_many([{"_id": i} for i in range(40, 100)])
        replies = []

        def reopen() -> bool:
            try:
                replies.append(
                    c.admin.command(
                        {
                            "parallelChangeStream": 1,
                            "nBuckets": N,
                            "name": "mode",
                            "bucketBy": "documentKey",
                            "resumeAfter": common,
                        }
                    )
                )
                return True
            except OperationFailure as exc:
                assert exc.code == 117
                return False

        wait_until(reopen, timeout=10)
        assert replies[0]["bucketBy"] == "documentKey"
        end = end_point(c)
        after = _drain_all(c, [cur["id"] for cur in replies[0]["cursors"]], end)
        ids = {b: [e["documentKey"]["_id"] for e in evs] for b, evs in enumerate(after)}
        assert sorted(i for got in ids.values() for i in got) == list(range(40, 100))
        assert all(bucket_of_document("m.c", i, N) == b for b, got in ids.items() for i in got)
        assert len([got for got in ids.values() if got]) > 1
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "mode"})
        assert (
            status["streamsRebucketed"] == 1 and status["streams"][0]["bucketBy"] == "documentKey"
        )
        # Attaching without bucketBy joins the stream as it is; with another, without nBuckets,
        # reopens it with the same count.
        assert "cursor" in c.admin.command({"parallelChangeStream": 1, "name": "mode", "bucket": 0})

        def attach_by_namespace() -> bool:
            try:
                c.admin.command(
                    {
                        "parallelChangeStream": 1,
                        "name": "mode",
                        "bucket": 1,
                        "bucketBy": "namespace",
                        "resumeAfter": token_from_key(end),
                    }
                )
                return True
            except OperationFailure as exc:
                assert exc.code == 117
                return False

        wait_until(attach_by_namespace, timeout=10)
        status = c.admin.command({"parallelChangeStreamStatus": 1, "name": "mode"})
        assert status["streamsRebucketed"] == 2
        assert (status["streams"][0]["bucketBy"], status["streams"][0]["nBuckets"]) == (
            "namespace",
            N,
        )

    await sync(work)
