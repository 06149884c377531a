"""Events larger than a server can return: BSONObjectTooLarge, and $changeStreamSplitLargeEvent's
fragments (the drivers' prose test 19), natively, through the proxy and from the engine."""

from __future__ import annotations

import uuid

import bson
import pymongo
import pytest
import trio
from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from bucketspark.client import StreamSpec, read_bucket
from mongoformats.errors import MongoError
from mongoformats.large_events import (
    MAX_EVENT_BYTES,
    SPLIT_ABOVE_BYTES,
    event_too_large,
    split_event,
)
from mongoformats.resume_token import (
    ResumeTokenData,
    decode_token,
    encode_token,
    fragment_of,
    token_sort_key,
)
from tests.conftest import client, sync
from tests.test_accelerate import accelerated

TEN_MB = 10 * 1024 * 1024


def _event(**fields):
    token = encode_token(
        ResumeTokenData(
            Timestamp(100, 1),
            uuid=uuid.UUID(int=7),
            event_identifier={"operationType": "update", "documentKey": {"_id": 1}},
        )
    )
    return bson.encode(
        {
            "_id": token,
            "operationType": "update",
            "clusterTime": Timestamp(100, 1),
            "ns": {"db": "d", "coll": "c"},
            "documentKey": {"_id": 1},
            **fields,
        }
    )


def test_the_size_limit_is_the_servers_with_mongos_merge_metadata():
    pad = len(_event(x=""))
    at_limit = _event(x="a" * (MAX_EVENT_BYTES - pad))
    assert len(at_limit) == MAX_EVENT_BYTES and event_too_large(at_limit) is None
    error = event_too_large(_event(x="a" * (MAX_EVENT_BYTES - pad + 1)))
    assert error is not None and error.code == 10334
    assert error.errmsg.startswith(
        f"BSONObj size: {MAX_EVENT_BYTES + 1} (0x{MAX_EVENT_BYTES + 1:X}) is invalid. "
        'Size must be between 0 and 16793600(16MB) First element: _id: { _data: "82'
    )
    # On mongos the shard measures the event with its `$sortKey: [token]`.
    merged = event_too_large(at_limit, merged=True)
    assert merged is not None and merged.code == 10334


def test_split_deals_fields_by_size_into_fragments_with_fragment_tokens():
    raw = _event(
        updateDescription={"updatedFields": {"v": "z" * TEN_MB}},
        fullDocumentBeforeChange={"_id": 1, "v": "q" * TEN_MB},
    )
    assert split_event(_event(small=1)) is None
    split = split_event(raw)
    fragments = [bson.decode(f) for _, f in split]
    assert [token for token, _ in split] == [f["_id"] for f in fragments]
    assert [f["splitEvent"] for f in fragments] == [
        {"fragment": 1, "of": 2},
        {"fragment": 2, "of": 2},
    ]
    # Every field but _id once, smallest first (then by name), each fragment within the limit:
    # the pre-image's element is 4 bytes shorter than the update description's.
    assert list(fragments[0]) == [
        "_id",
        "splitEvent",
        "clusterTime",
        "operationType",
        "documentKey",
        "ns",
        "fullDocumentBeforeChange",
    ]
    assert list(fragments[1]) == ["_id", "splitEvent", "updateDescription"]
    assert all(len(f) <= SPLIT_ABOVE_BYTES for _, f in split)
    whole = bson.decode(raw)
    assert {k: v for f in fragments for k, v in f.items() if k not in ("_id", "splitEvent")} == {
        k: v for k, v in whole.items() if k != "_id"
    }
    # The fragments' tokens: the event's with fragmentNum, sorting after it and in order.
    assert [decode_token(f["_id"]).fragment_num for f in fragments] == [0, 1]
    keys = [token_sort_key(whole["_id"]), *(token_sort_key(f["_id"]) for f in fragments)]
    assert keys == sorted(keys) and len(set(keys)) == 3
    # Resuming past fragment 1 returns fragment 2; past the last, nothing; a split that no longer
    # matches the token fails the stream, as the server's does.
    assert split_event(raw, skip=1) == split[1:] and split_event(raw, skip=2) == []
    for bad_raw, skip in ((raw, 3), (_event(small=1), 1)):
        with pytest.raises(MongoError) as err:
            split_event(bad_raw, skip=skip)
        assert err.value.code == 280


def _prose_19(uri: str, db_name: str) -> None:
    """The drivers' prose test 19, then what a stream without the split stage and a resume from
    the first fragment make of the same event."""
    c = client(uri)
    db = c[db_name]
    db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
    db.c.insert_one({"value": "q" * TEN_MB})
    with (
        db.c.watch(
            [{"$changeStreamSplitLargeEvent": {}}], full_document_before_change="required"
        ) as split,
        db.c.watch([], full_document_before_change="required") as plain,
    ):
        db.c.update_one({}, {"$set": {"value": "z" * TEN_MB}})
        first, second = split.next(), split.next()
        assert [first["splitEvent"], second["splitEvent"]] == [
            {"fragment": 1, "of": 2},
            {"fragment": 2, "of": 2},
        ]
        with pytest.raises(pymongo.errors.OperationFailure) as err:
            plain.next()
        assert err.value.code == 10334
    with db.c.watch(
        [{"$changeStreamSplitLargeEvent": {}}],
        full_document_before_change="required",
        resume_after=first["_id"],
    ) as resumed:
        assert resumed.next() == second


@pytest.mark.parametrize("via", ["mongos", "replica set", "accelerated proxy"])
async def test_large_events_split_or_fail_as_a_server_returns_them(via):
    async with accelerated(shards=2) as (cluster, server):
        uri = {
            "mongos": cluster.uri,
            "replica set": cluster.shard_uri("shard0"),
            "accelerated proxy": f"mongodb://127.0.0.1:{server.port}/",
        }[via]
        await sync(_prose_19, uri, "big", timeout=120)
        if (
            via == "accelerated proxy"
        ):  # the engine split the event, failed the plain stream, resumed
            assert server.engine.watches == {"accelerated": 3, "passedThrough": 0}, (
                server.engine.watches
            )


async def test_the_engine_splits_large_events_as_mongos_does():
    """The same fragments, byte for byte, from mongos, from an accelerated watch() and from a
    parallelChangeStream bucket opened with the split stage; resumed from a fragment's token,
    each returns the fragments after it, and the bucket's consumer goes on past the event."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied = client(cluster.uri), client(f"mongodb://127.0.0.1:{server.port}/")
            direct.big.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
            direct.big.c.insert_one({"_id": 1, "value": "q" * TEN_MB})
            now = direct.admin.command("ping")["operationTime"]
            start = Timestamp(now.time, now.inc + 1)  # after the insert
            direct.big.c.update_one({"_id": 1}, {"$set": {"value": "z" * TEN_MB}})
            direct.big.c.insert_one({"_id": 2})
            split = [{"$changeStreamSplitLargeEvent": {}}]
            options = {"full_document_before_change": "required", "max_await_time_ms": 300}

            def three(c, **more):
                with c.big.c.watch(split, **options, **more) as stream:
                    return [stream.next() for _ in range(3)]

            want = three(direct, start_at_operation_time=start)
            assert [e.get("splitEvent") for e in want] == [
                {"fragment": 1, "of": 2},
                {"fragment": 2, "of": 2},
                None,
            ]
            assert [bson.encode(e) for e in three(proxied, start_at_operation_time=start)] == [
                bson.encode(e) for e in want
            ]
            with proxied.big.c.watch(split, **options, resume_after=want[0]["_id"]) as resumed:
                assert [bson.encode(resumed.next()), bson.encode(resumed.next())] == [
                    bson.encode(e) for e in want[1:]
                ]
            assert server.engine.watches["passedThrough"] == 0

            # A bucket: the pipeline ends with the split stage.
            opened = proxied.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 1,
                    "name": "big",
                    "startAtOperationTime": start,
                    "pipeline": split,
                    "fullDocumentBeforeChange": "required",
                }
            )
            cursor = opened["cursors"][0]
            got = list(cursor["firstBatch"])
            while len(got) < 3:
                more = proxied.admin.command(
                    {
                        "getMore": cursor["id"],
                        "collection": "$cmd.parallelChangeStream",
                        "maxTimeMS": 300,
                    }
                )
                got += more["cursor"]["nextBatch"]
            assert [bson.encode(e) for e in got[:3]] == [bson.encode(e) for e in want]
            proxied.admin.command(
                {"killCursors": "$cmd.parallelChangeStream", "cursors": [cursor["id"]]}
            )
            attached = proxied.admin.command(
                {
                    "parallelChangeStream": 1,
                    "name": "big",
                    "bucket": 0,
                    "resumeAfter": want[0]["_id"],
                }
            )["cursor"]
            rest = list(attached["firstBatch"])
            while len(rest) < 2:
                more = proxied.admin.command(
                    {
                        "getMore": attached["id"],
                        "collection": "$cmd.parallelChangeStream",
                        "maxTimeMS": 300,
                    }
                )
                rest += more["cursor"]["nextBatch"]
            assert [bson.encode(e) for e in rest[:2]] == [bson.encode(e) for e in want[1:]]

            # A Spark task's read: the fragments joined back into the event, up to the event's
            # token.
            spec = StreamSpec(
                uri=f"mongodb://127.0.0.1:{server.port}/",
                name="big",
                n_buckets=1,
                pipeline=tuple(split),
                full_document_before_change="required",
            )
            whole = fragment_of(want[0]["_id"])
            assert whole is not None
            events = list(
                read_bucket(
                    proxied,
                    spec,
                    0,
                    opened["cursors"][0]["postBatchResumeToken"]["_data"],
                    whole[0].hex().upper(),
                )
            )
            assert len(events) == 1 and events[0]["_id"]["_data"] == whole[0].hex().upper()
            joined = bson.decode(events[0].raw)
            assert (
                "splitEvent" not in joined
                and joined["fullDocumentBeforeChange"]["value"] == "q" * TEN_MB
            )
            assert {k: v for k, v in joined.items() if k != "_id"} == {
                k: v for f in want[:2] for k, v in f.items() if k not in ("_id", "splitEvent")
            }

        await sync(work, timeout=120)


async def test_a_split_event_comes_from_one_lookup_even_if_the_document_changes_meanwhile():
    """The server splits an event once and queues its fragments. The engine split it again for
    each getMore, so a document that changed between two fragments' getMores gave fragments of
    two different events (here: a second fragment of an event that no longer splits)."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            direct, proxied = client(cluster.uri), client(f"mongodb://127.0.0.1:{server.port}/")
            direct.big.c.insert_one({"_id": 1, "value": "q"})
            now = direct.admin.command("ping")["operationTime"]
            start = Timestamp(now.time, now.inc + 1)
            direct.big.c.update_one({"_id": 1}, {"$set": {"value": "z" * TEN_MB}})
            for c in (direct, proxied):
                with c.big.c.watch(
                    [{"$changeStreamSplitLargeEvent": {}}],
                    full_document="updateLookup",
                    start_at_operation_time=start,
                    max_await_time_ms=300,
                ) as stream:
                    first = stream.next()
                    direct.big.c.update_one({"_id": 1}, {"$set": {"value": "small"}})
                    second = stream.next()
                direct.big.c.update_one({"_id": 1}, {"$set": {"value": "z" * TEN_MB}})  # as it was
                assert [first["splitEvent"], second["splitEvent"]] == [
                    {"fragment": 1, "of": 2},
                    {"fragment": 2, "of": 2},
                ]
                joined = {**first, **second}
                assert (
                    joined["fullDocument"]["value"]
                    == joined["updateDescription"]["updatedFields"]["value"]
                )
            assert server.engine.watches == {"accelerated": 1, "passedThrough": 0}, (
                server.engine.watches
            )

        await sync(work, timeout=120)


async def test_a_bucket_returns_the_events_before_a_too_large_one_then_fails_like_the_server():
    async with accelerated(shards=2) as (cluster, server):

        def work():
            c = client(f"mongodb://127.0.0.1:{server.port}/")
            c.big.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
            start = c.admin.command("ping")["operationTime"]
            c.big.c.insert_one({"_id": 1, "value": "q" * TEN_MB})
            c.big.c.update_one({"_id": 1}, {"$set": {"value": "z" * TEN_MB}})  # its event: ~20 MB
            c.big.c.insert_one({"_id": 2})
            opened = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 1,
                    "startAtOperationTime": start,
                    "fullDocumentBeforeChange": "whenAvailable",
                }
            )
            cursor = opened["cursors"][0]
            seen = list(cursor["firstBatch"])
            with pytest.raises(pymongo.errors.OperationFailure) as err:
                while True:  # the insert, then the getMore that reaches the update fails
                    more = c.admin.command(
                        {
                            "getMore": cursor["id"],
                            "collection": "$cmd.parallelChangeStream",
                            "maxTimeMS": 500,
                        }
                    )
                    seen += more["cursor"]["nextBatch"]
            assert err.value.code == 10334 and "BSONObj size: " in str(err.value)
            assert [e["operationType"] for e in seen] == ["insert"] and seen[0]["documentKey"] == {
                "_id": 1
            }
            with pytest.raises(
                pymongo.errors.OperationFailure
            ) as gone:  # as on mongos: the cursor is closed
                c.admin.command(
                    {"getMore": cursor["id"], "collection": "$cmd.parallelChangeStream"}
                )
            assert gone.value.code == 43

        await sync(work, timeout=120)
        await trio.lowlevel.checkpoint()


async def test_a_native_reply_stays_under_16_mib_whatever_its_events():
    """A server stops a batch at the document that would take the reply past 16 MiB and returns
    it first in the next getMore. simcluster's mongos filled a catch-up reply with one oplog read
    of each shard, up to 16 MiB each: with two shards' worth of one-MiB inserts, a 31 MiB reply."""
    async with accelerated(shards=2) as (cluster, server):

        def work():
            c = client(cluster.uri)
            c.admin.command("shardCollection", "big.c", key={"_id": "hashed"})
            start = c.admin.command("ping")["operationTime"]
            c.big.c.insert_many([{"_id": i, "v": "x" * (1 << 20)} for i in range(40)])
            raw = CodecOptions(document_class=RawBSONDocument)
            reply = c.big.command(
                {
                    "aggregate": "c",
                    "pipeline": [{"$changeStream": {"startAtOperationTime": start}}],
                    "cursor": {},
                },
                codec_options=raw,
            )
            sizes = [len(reply.raw)]
            ids = [bson.decode(e.raw)["documentKey"]["_id"] for e in reply["cursor"]["firstBatch"]]
            cursor_id = reply["cursor"]["id"]
            while len(ids) < 40:
                reply = c.big.command(
                    {"getMore": cursor_id, "collection": "c", "maxTimeMS": 500}, codec_options=raw
                )
                sizes.append(len(reply.raw))
                ids += [
                    bson.decode(e.raw)["documentKey"]["_id"] for e in reply["cursor"]["nextBatch"]
                ]
            assert sorted(ids) == list(range(40))
            assert max(sizes) <= 16 * 1024 * 1024 and len(sizes) >= 3, sizes

        await sync(work)
