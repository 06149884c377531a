"""Where a resumed change stream starts, as a server decides it: the event a token names must be
met again (after the stream's scope and $match), a stream that starts inside a transaction reads
the transaction's earlier oplog entries back by prevOpTime, and a resume point is never an event
that the stream's stages dropped. On mongos, on a replica set and through the accelerated proxy."""

from __future__ import annotations

import dataclasses
from typing import Any

import bson
import pytest
from pymongo.errors import OperationFailure

from mongoformats.resume_token import decode_token, encode_token
from tests.conftest import client, sync
from tests.integration.test_accelerate import _clients, _collect, _is_marker, accelerated
from tests.integration.test_engine import drain, end_point


def _encoded(events: list[Any]) -> list[bytes]:
    return [bson.encode(e) for e in events]


async def test_a_stream_resumed_inside_a_transaction_returns_the_rest_of_it():
    """A transaction too large for one applyOps entry (a partialTxn chain) and a prepared one over
    two shards: their events all carry the commit's time, but most of their operations are in
    entries before it. A stream that starts at that time, or resumes from one of those events,
    must read them back (the server follows prevOpTime); reading from the commit on, simcluster
    and the engine both lost them."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            direct.admin.command("shardCollection", "rp.h", key={"_id": "hashed"})
            direct.rp.h.insert_many([{"_id": i} for i in range(20)])
            with (
                direct.start_session() as s
            ):  # 700 writes on one shard: a chain of two applyOps entries
                s.with_transaction(
                    lambda s: direct.rp.u.insert_many([{"_id": i} for i in range(700)], session=s)
                )
            with direct.start_session() as s:  # both shards: prepared on each, then committed
                s.with_transaction(
                    lambda s: [
                        direct.rp.h.update_one({"_id": i}, {"$set": {"v": 1}}, session=s)
                        for i in range(8)
                    ]
                )
            direct.rp.u.insert_one({"_id": "end", "marker": True})
            everything = _collect(
                direct.watch(start_at_operation_time=start, max_await_time_ms=200), _is_marker
            )
            chain = [e for e in everything if e["ns"]["coll"] == "u" and "lsid" in e]
            prepared = [e for e in everything if e["ns"]["coll"] == "h" and "lsid" in e]
            assert len(chain) == 700 and len(prepared) == 8
            # rp.u is created inside the transaction: its create is the applyOps' first entry (as
            # on a server), and txnOpIndex counts it too.
            assert decode_token(chain[100]["_id"]).txn_op_index == 101
            for event in (chain[0], chain[100], chain[600], prepared[2]):
                want = everything[everything.index(event) + 1 :]
                for c in (direct, proxied):
                    got = _collect(
                        c.watch(resume_after=event["_id"], max_await_time_ms=200), _is_marker
                    )
                    assert _encoded(got) == _encoded(want), (c is proxied, event["documentKey"])
            # Starting at the commit's time: the whole transaction.
            at = chain[0]["clusterTime"]
            for c in (direct, proxied):
                got = _collect(
                    c.watch(start_at_operation_time=at, max_await_time_ms=200), _is_marker
                )
                assert _encoded(got) == _encoded(everything[everything.index(chain[0]) :])

            # A bucket resumed from inside the chain, read in a reader process: the events after
            # it, as a native stream has them.
            opened = proxied.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 1,
                    "readerProcesses": 1,
                    "resumeAfter": chain[100]["_id"],
                }
            )
            cursor_id = opened["cursors"][0]["id"]
            got = drain(proxied, cursor_id, end_point(proxied))
            native = everything[everything.index(chain[100]) + 1 :]
            assert _encoded([bson.decode(e.raw) for e in got]) == _encoded(native)

        await sync(work)


@pytest.mark.parametrize("where", ["mongos", "replica set"])
async def test_a_token_the_resumed_stream_does_not_have_fails_it(where):
    """The server's EnsureResumeTokenPresent: a token's event must be in the resumed stream, after
    its scope and its $match (both filter before that check). A stream whose next event is past
    the token without having met it fails with ChangeStreamFatalError, which no driver resumes.
    (A connector found this with a $match narrowed between runs: PeerDB-io/peerdb#3246.)"""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied, _ = _clients(cluster, server)
            db = direct.rp
            db.t1.insert_one({"_id": 0})
            db.t2.insert_one({"_id": 0})  # both collections on the database's primary shard
            primary = direct.config.databases.find_one({"_id": "rp"})["primary"]
            targets = (
                [direct, proxied] if where == "mongos" else [client(cluster.shard_uri(primary))]
            )
            for n, c in enumerate(targets):
                both = [{"$match": {"ns.coll": {"$in": ["t1", "t2"]}}}]
                stream = c.rp.watch(both, max_await_time_ms=200)
                db.t1.insert_one({"_id": f"a{n}"})
                token = stream.next()["_id"]
                stream.close()
                only_t2 = [{"$match": {"ns.coll": "t2"}}]
                resumed = c.rp.watch(only_t2, resume_after=token, max_await_time_ms=200)
                db.t2.insert_one({"_id": f"b{n}"})
                with pytest.raises(OperationFailure) as failed:
                    for _ in range(20):
                        resumed.try_next()
                assert failed.value.code == 280
                assert failed.value.details["errmsg"].startswith(
                    'cannot resume stream; the resume token was not found. {_data: "'
                )
                assert "NonResumableChangeStreamError" in failed.value.details["errorLabels"]
                # The same token, in a stream that has its event: the events after it.
                ok = c.rp.watch(both, resume_after=token, max_await_time_ms=200)
                assert ok.next()["documentKey"] == {"_id": f"b{n}"}
                ok.close()
                # And a token of another collection's stream.
                with (
                    pytest.raises(OperationFailure) as failed,
                    c.rp.t2.watch(resume_after=token, max_await_time_ms=200) as other,
                ):
                    db.t2.insert_one({"_id": f"c{n}"})
                    for _ in range(20):
                        other.try_next()
                assert failed.value.code == 280

        await sync(work)


async def test_resuming_from_a_fragment_needs_the_split_stage():
    """A fragment's token resumes only a stream that splits events again: without
    $changeStreamSplitLargeEvent, the aggregate itself fails (ChangeStreamFatalError)."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            direct.rp.f.insert_one({"_id": 1, "marker": True})
            event = _collect(
                direct.rp.f.watch(start_at_operation_time=start, max_await_time_ms=200), _is_marker
            )[-1]
            fragment = encode_token(dataclasses.replace(decode_token(event["_id"]), fragment_num=0))
            for c in (direct, proxied):
                with pytest.raises(OperationFailure) as failed:
                    c.rp.f.watch(resume_after=fragment)
                assert failed.value.code == 280
                assert failed.value.details["errmsg"] == (
                    "To resume from a split event, the $changeStream pipeline "
                    "must include a $changeStreamSplitLargeEvent stage"
                )

        await sync(work)


async def test_an_event_the_stages_drop_is_never_the_resume_point():
    """A batch that ends on events a $match dropped reports the last event returned (or, once
    caught up, the high-water mark) as its postBatchResumeToken: a driver that resumes from it
    must meet that event again. Through the proxy, whose cursor drops them after its lookups."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied, start = _clients(cluster, server)
            direct.rp.m.insert_many([{"_id": i, "keep": i % 10 == 0} for i in range(200)])
            direct.rp.m.insert_one({"_id": "end", "keep": True, "marker": True})
            # The lookup makes the engine apply the whole pipeline per returned event.
            pipeline = [{"$match": {"fullDocument.keep": True}}]
            for c in (direct, proxied):
                stream = c.rp.m.watch(
                    pipeline,
                    start_at_operation_time=start,
                    full_document="updateLookup",
                    batch_size=3,
                    max_await_time_ms=200,
                )
                seen = []
                while not seen or not _is_marker(seen[-1]):
                    ev = stream.try_next()
                    if ev is not None:
                        seen.append(ev)
                    token = stream.resume_token
                    kind = decode_token(token).token_type
                    assert kind == 0 or token in [e["_id"] for e in seen], (c is proxied, token)
                stream.close()
                assert [e["documentKey"]["_id"] for e in seen] == [*range(0, 200, 10), "end"]
                # Resuming from a point between two batches returns the rest.
                rest = _collect(
                    c.rp.m.watch(
                        pipeline,
                        resume_after=seen[5]["_id"],
                        full_document="updateLookup",
                        max_await_time_ms=200,
                    ),
                    _is_marker,
                )
                assert _encoded(rest) == _encoded(seen[6:])

        await sync(work)
