"""Audit items of the single-collection stream rules, resuming, the spec's errors, the read
concern and the cluster time (fidelity-audit-2026-11-26.md D7, D8, D9, D19, D20; the invalidate
through the user's stages), run on simcluster's mongos (whose change stream is the independent
reference) and through the proxy's accelerated `watch()`, each expecting what the server's source
and jstests give. Where the engine still differs, the accelerated case is a strict xfail naming
the item."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mongoformats.resume_token import EVENT_TOKEN, ResumeTokenData, decode_token, encode_token
from tests.conftest import client, sync
from tests.integration.test_accelerate import accelerated


def _until(stream: Any, stop: Any, timeout: float = 30) -> list[dict[str, Any]]:
    """Events up to and including the first for which `stop` holds, or an invalidate."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
            if stop(ev) or ev["operationType"] == "invalidate":
                break
    stream.close()
    return out


def _outcome(work: Any) -> Any:
    """`work()`'s value, or its failure as text: the test then asserts after the cluster and the
    proxy are closed in order (a failure inside would leave the clients to close on a stopped
    proxy)."""
    from pymongo.errors import OperationFailure

    try:
        return work()
    except (
        OperationFailure,
        AssertionError,
        pytest.fail.Exception,
    ) as exc:  # (the last: DID NOT RAISE)
        return f"{type(exc).__name__}: {exc}"


def _uri(cluster: Any, server: Any, via: str) -> str:
    return cluster.uri if via == "direct" else f"mongodb://127.0.0.1:{server.port}/"


def _is_end(ev: dict[str, Any]) -> bool:
    return ev["operationType"] == "insert" and ev["documentKey"]["_id"] == "end"


@pytest.mark.parametrize("via", ["direct", "accelerated"])
async def test_d7_single_collection_stream_sees_no_view_events(via):
    """A single-collection stream never uses the view transform (ChangeStreamEventTransformer::
    getBuilder: only `!_isSingleCollStream`), and its namespace regex never matches
    db.system.views: jstests/change_streams/ddl_view_events.js "Confirm that the stream only sees
    the normal collection creation, not the view events"."""
    async with accelerated(shards=1) as (cluster, server):

        def work() -> list[str]:
            direct = client(cluster.uri)
            start = direct.admin.command("ping")["operationTime"]
            db = direct.d7
            db.create_collection("base")
            db.command({"create": "vv", "viewOn": "base", "pipeline": []})
            db.drop_collection("vv")
            db.create_collection("vv")
            db.vv.insert_one({"_id": "end"})
            stream = client(_uri(cluster, server, via)).d7.vv.watch(
                start_at_operation_time=start, show_expanded_events=True, max_await_time_ms=100
            )
            events = _until(stream, _is_end)
            return [e["operationType"] for e in events], "collectionUUID" in events[0]

        got = await sync(_outcome, work)
    assert got == (["create", "insert"], True)


# Through the proxy, the stream started after the invalidate is passed through to mongos (the
# engine serves the first one): the engine's own dropDatabase rule is not reached by this test.
@pytest.mark.parametrize("via", ["direct", "accelerated"])
async def test_d8_start_after_invalidate_skips_drop_database(via):
    """A single-collection stream never sees dropDatabase: change_stream_filter_helpers.cpp
    buildOperationFilter, "Omit dropDatabase on single-collection streams. While the stream will
    be invalidated before it sees this event, the user will incorrectly see it if they startAfter
    the invalidate." Started after the invalidate, it goes on with the collection's later events."""
    async with accelerated(shards=1) as (cluster, server):

        def work() -> tuple[list[str], list[str]]:
            direct = client(cluster.uri)
            start = direct.admin.command("ping")["operationTime"]
            direct.d8.x.insert_one({"_id": 1})
            direct.drop_database("d8")
            coll = client(_uri(cluster, server, via)).d8.x
            first = _until(
                coll.watch(start_at_operation_time=start, max_await_time_ms=100), lambda ev: False
            )
            direct.d8.x.insert_one({"_id": "end"})
            after = _until(coll.watch(start_after=first[-1]["_id"], max_await_time_ms=100), _is_end)
            return [e["operationType"] for e in first], [e["operationType"] for e in after]

        got = await sync(_outcome, work)
    assert got == (["insert", "drop", "invalidate"], ["insert"])


@pytest.mark.parametrize("via", ["direct", "accelerated"])
async def test_d9_resume_from_a_v1_event_token(via):
    """A 6.0-era (v1) event token resumes a 7.0 stream: makeResumeToken keeps the resume token's
    version for events at its clusterTime (`(clusterTime > _resumeToken.clusterTime) ?
    changeStreamTokenVersion : _resumeToken.version`), so the event is found again; later events
    carry v2 tokens (change_stream_event_transform.cpp; resume_token.cpp accepts versions 0-2)."""
    async with accelerated(shards=1) as (cluster, server):

        def work() -> list[Any]:
            direct = client(cluster.uri)
            start = direct.admin.command("ping")["operationTime"]
            for _id in (1, 2, "end"):
                direct.d9.c.insert_one({"_id": _id})
            first = _until(
                direct.d9.c.watch(start_at_operation_time=start, max_await_time_ms=100), _is_end
            )[0]
            data = decode_token(first["_id"])
            v1 = encode_token(
                ResumeTokenData(
                    data.cluster_time,
                    1,
                    EVENT_TOKEN,
                    data.txn_op_index,
                    False,
                    data.uuid,
                    first["documentKey"],
                )
            )
            coll = client(_uri(cluster, server, via)).d9.c
            events = _until(coll.watch(resume_after=v1, max_await_time_ms=100), _is_end)
            return [(e["documentKey"]["_id"], decode_token(e["_id"]).version) for e in events]

        got = await sync(_outcome, work)
    assert got == [(2, 2), ("end", 2)]


_BAD_SPECS = [
    (
        {"fullDocument": 1},
        14,
        "BSON field '$changeStream.fullDocument' is the wrong type 'int', expected type 'string'",
    ),
    (
        {"showExpandedEvents": "yes"},
        14,
        "BSON field '$changeStream.showExpandedEvents' is the wrong type 'string', "
        "expected type 'bool'",
    ),
    (
        {"resumeAfter": "x"},
        14,
        "BSON field '$changeStream.resumeAfter' is the wrong type 'string', expected type 'object'",
    ),
    (
        {"startAtOperationTime": 5},
        14,
        "BSON field '$changeStream.startAtOperationTime' is the wrong type 'int', "
        "expected type 'timestamp'",
    ),
    (
        {"fullDocument": "bogus"},
        2,
        "Enumeration value 'bogus' for field '$changeStream.fullDocument' is not a valid value.",
    ),
    (1, 6188500, "$changeStream must take a nested object but found: $changeStream: 1"),
]


_IDS = ["d19a", "d19b", "d19c", "d19d", "d19f", "d19e"]


def _cases() -> list[Any]:
    return [
        pytest.param(spec, code, message, via, id=f"{name}-{via}")
        for (spec, code, message), name in zip(_BAD_SPECS, _IDS, strict=True)
        for via in ("direct", "accelerated")
    ]


@pytest.mark.parametrize("spec,code,message,via", _cases())
async def test_d19_change_stream_spec_errors_as_the_idl_gives_them(spec, code, message, via):
    """The $changeStream spec is parsed by the IDL (document_source_change_stream.idl: resumeAfter
    and startAfter are `resumeToken`, bson_serialization_type object; startAtOperationTime a
    timestamp; the modes string enums; the flags bool): a wrong type is TypeMismatch with the IDL's
    message, a bad enum value IDLParserContext::throwBadEnumValue's BadValue, and a spec that is
    no object DocumentSourceChangeStream::LiteParsed's 6188500."""
    from pymongo.errors import OperationFailure

    async with accelerated(shards=1) as (cluster, server):

        def work() -> Any:
            with pytest.raises(OperationFailure) as err:
                client(_uri(cluster, server, via)).d19.c.aggregate([{"$changeStream": spec}])
            return err.value.code, err.value.details["errmsg"]

        got = await sync(_outcome, work)
    assert got == (code, message)


@pytest.mark.parametrize("via", ["direct", "accelerated"])
async def test_user_stages_see_the_invalidate(via):
    """The invalidate is made by $changeStream's own CheckInvalidate stage, ahead of the user's
    stages (document_source_change_stream.cpp builds it into the stage's pipeline): a $match on
    operationType "invalidate" returns it, one on "insert" drops it, and either way the stream
    ends, its last postBatchResumeToken the invalidate's."""
    async with accelerated(shards=1) as (cluster, server):

        def work() -> tuple[list[str], list[str], bool, bool]:
            direct = client(cluster.uri)
            start = direct.admin.command("ping")["operationTime"]
            direct.inv.c.insert_one({"_id": 1})
            direct.inv.c.drop()
            coll = client(_uri(cluster, server, via)).inv.c
            only = coll.watch(
                [{"$match": {"operationType": "invalidate"}}],
                start_at_operation_time=start,
                max_await_time_ms=100,
            )
            events = _until(only, lambda ev: False, timeout=5)
            kept = [e["operationType"] for e in events]
            inserts = coll.watch(
                [{"$match": {"operationType": "insert"}}],
                start_at_operation_time=start,
                max_await_time_ms=100,
            )
            seen = []
            deadline = time.monotonic() + 5
            while inserts.alive and time.monotonic() < deadline:
                ev = inserts.try_next()
                if ev is not None:
                    seen.append(ev["operationType"])
            # Closed by the invalidate it did not return: its last resume token is the invalidate's.
            return kept, seen, inserts.alive, inserts.resume_token == events[-1]["_id"]

        got = await sync(_outcome, work)
    assert got == (["invalidate"], ["insert"], False, True)


@pytest.mark.parametrize("via", ["direct", "accelerated"])
async def test_d9_resume_from_a_v1_high_water_mark_keeps_v1_at_its_time(via):
    """Resumed from a v1 high-water mark, the events at its clusterTime have v1 tokens and later
    ones v2 (makeResumeToken: `(clusterTime > _resumeToken.clusterTime) ?
    changeStreamTokenVersion : _resumeToken.version`)."""
    from mongoformats.resume_token import HIGH_WATER_MARK

    async with accelerated(shards=1) as (cluster, server):

        def work() -> list[Any]:
            direct = client(cluster.uri)
            start = direct.admin.command("ping")["operationTime"]
            for _id in (1, 2, "end"):
                direct.d9h.c.insert_one({"_id": _id})
            first = _until(
                direct.d9h.c.watch(start_at_operation_time=start, max_await_time_ms=100), _is_end
            )[0]
            hwm = encode_token(ResumeTokenData(first["clusterTime"], 1, HIGH_WATER_MARK))
            coll = client(_uri(cluster, server, via)).d9h.c
            events = _until(coll.watch(resume_after=hwm, max_await_time_ms=100), _is_end)
            return [(e["documentKey"]["_id"], decode_token(e["_id"]).version) for e in events]

        got = await sync(_outcome, work)
    assert got == [(1, 1), (2, 2), ("end", 2)]


@pytest.mark.parametrize("via", ["direct", "accelerated"])
async def test_d19f_missing_required_image_names_the_event(via):
    """NoMatchingDocument's message ends with the event as makePreImageNotFoundErrorMsg prints it
    ({operationType, ns, clusterTime, txnNumber?}, Document::toString), for the post-image stage
    too (change_stream_add_post_image_stage.cpp)."""
    from pymongo.errors import OperationFailure

    async with accelerated(shards=1) as (cluster, server):

        def work() -> tuple[int, str, str]:
            direct = client(cluster.uri)
            start = direct.admin.command("ping")["operationTime"]
            direct.d47.c.insert_one({"_id": 1})
            direct.d47.c.update_one({"_id": 1}, {"$set": {"a": 1}})
            update = _until(
                direct.d47.c.watch(start_at_operation_time=start, max_await_time_ms=100),
                lambda ev: ev["operationType"] == "update",
            )[-1]
            coll = client(_uri(cluster, server, via)).d47.c
            with pytest.raises(OperationFailure) as err:
                _until(
                    coll.watch(
                        start_at_operation_time=start,
                        full_document="required",
                        max_await_time_ms=100,
                    ),
                    lambda ev: ev["operationType"] == "update",
                    timeout=10,
                )
            ts = update["clusterTime"]
            return err.value.code, err.value.details["errmsg"], f"Timestamp({ts.time}, {ts.inc})"

        got = await sync(_outcome, work)
    assert isinstance(got, tuple), got
    code, message, ts = got
    assert (code, message) == (
        47,
        "Change stream was configured to require a post-image for all update events, "
        'but the post-image was not found for event: {operationType: "update", '
        f'ns: {{db: "d47", coll: "c"}}, clusterTime: {ts}}}',
    )


@pytest.mark.parametrize("via", ["direct", "accelerated"])
async def test_d8_drop_database_does_not_end_a_stream_on_a_collection_it_did_not_hold(via):
    """The same rule (buildOperationFilter omits dropDatabase on single-collection streams) on a
    stream the engine serves: the collection did not exist when its database was dropped, so no
    drop comes first, and the stream goes on to the collection's later events."""
    async with accelerated(shards=1) as (cluster, server):

        def work() -> list[str]:
            direct = client(cluster.uri)
            start = direct.admin.command("ping")["operationTime"]
            direct.d8b.other.insert_one({"_id": 1})
            direct.drop_database("d8b")
            direct.d8b.x.insert_one({"_id": "end"})
            coll = client(_uri(cluster, server, via)).d8b.x
            return [
                e["operationType"]
                for e in _until(
                    coll.watch(start_at_operation_time=start, max_await_time_ms=100),
                    _is_end,
                    timeout=10,
                )
            ]

        got = await sync(_outcome, work)
    assert got == ["insert"]


@pytest.mark.parametrize("via", ["direct", "accelerated"])
async def test_a_rename_into_the_watched_database_is_seen(via):
    """buildOperationFilter (change_stream_filter_helpers.cpp) matches a renameCollection whose
    source or whose target (`o.to`) is in the stream's namespace: a database stream sees a
    collection renamed into its database from another one."""
    async with accelerated(shards=1) as (cluster, server):

        def work() -> list[Any]:
            direct = client(cluster.uri)
            start = direct.admin.command("ping")["operationTime"]
            direct.rsrc.a.insert_one({"_id": 1})
            direct.admin.command("renameCollection", "rsrc.a", to="rdst.b")
            direct.rdst.b.insert_one({"_id": "end"})
            db = client(_uri(cluster, server, via)).rdst
            events = _until(
                db.watch(start_at_operation_time=start, max_await_time_ms=100), _is_end, timeout=10
            )
            return [(e["operationType"], e["ns"], e.get("to")) for e in events]

        got = await sync(_outcome, work)
    assert got == [
        ("rename", {"db": "rsrc", "coll": "a"}, {"db": "rdst", "coll": "b"}),
        ("insert", {"db": "rdst", "coll": "b"}, None),
    ]


@pytest.mark.parametrize("via", ["direct", "accelerated"])
async def test_a_change_stream_reads_at_majority_only(via):
    """$changeStream supports the majority read concern alone (DocumentSourceChangeStream::
    LiteParsed::supportsReadConcern: onlySingleReadConcernSupported(majority)): local and
    linearizable fail with InvalidOptions, majority and none work
    (jstests/noPassthrough/change_stream_require_majority_read_concern.js)."""
    from pymongo.errors import OperationFailure
    from pymongo.read_concern import ReadConcern

    async with accelerated(shards=1) as (cluster, server):

        def work() -> dict[str, Any]:
            client(cluster.uri).rc.c.insert_one({"_id": 1})
            coll = client(_uri(cluster, server, via)).rc.c
            out: dict[str, Any] = {}
            for level in ("local", "linearizable", "majority", None):
                try:
                    coll.with_options(read_concern=ReadConcern(level)).watch(
                        max_await_time_ms=100
                    ).close()
                    out[str(level)] = "ok"
                except OperationFailure as exc:
                    out[str(level)] = (exc.code, exc.details["errmsg"])
            return out

        got = await sync(_outcome, work)
    message = (
        "Aggregation stage $changeStream cannot run with a readConcern other than 'majority'. "
        "Current readConcern: "
    )
    assert got == {
        "local": (72, message + "local"),
        "linearizable": (72, message + "linearizable"),
        "majority": "ok",
        "None": "ok",
    }


async def test_d20_replies_the_proxy_makes_carry_the_cluster_time():
    """Every mongos reply has `$clusterTime` and `operationTime` (the drivers' sessions spec
    gossips them): the accelerated aggregate and getMore, and hello, through the proxy too. The
    `$clusterTime` is a document mongos sent, signature included, as it came."""
    async with accelerated(shards=1) as (cluster, server):

        def work() -> tuple[list[Any], bool]:
            direct = client(cluster.uri)
            proxied = client(_uri(cluster, server, "accelerated"))
            hello = proxied.admin.command("hello")  # the first command of this client
            start = direct.admin.command("ping")["operationTime"]
            direct.ct.c.insert_one({"_id": 1})
            opened = proxied.ct.command(
                {
                    "aggregate": "c",
                    "pipeline": [{"$changeStream": {"startAtOperationTime": start}}],
                    "cursor": {},
                }
            )
            more = proxied.ct.command(
                {"getMore": opened["cursor"]["id"], "collection": "c", "maxTimeMS": 100}
            )
            proxied.ct.command({"killCursors": "c", "cursors": [opened["cursor"]["id"]]})
            replies = [opened, more, hello]
            keys = [sorted(k for k in r if k in ("$clusterTime", "operationTime")) for r in replies]
            seen = direct.admin.command("ping")["$clusterTime"]
            signed = all(set(r["$clusterTime"]) == set(seen) for r in replies) and all(
                r["$clusterTime"]["clusterTime"] >= start for r in (opened, more)
            )
            return keys, signed

        got = await sync(_outcome, work)
    assert got == ([["$clusterTime", "operationTime"]] * 3, True)


async def test_show_system_events_through_the_accelerated_watch():
    """With showSystemEvents (and showExpandedEvents) a stream shows migrateLastChunkFromShard
    when a migration takes a shard's last chunk of the collection (buildInternalOpFilter), and the
    create/createIndexes a migration writes on the recipient (buildFromMigrateSystemOpFilter): the
    engine serves such a watch() itself, with mongos's events."""
    import bson
    from bson import MinKey

    async with accelerated(shards=2) as (cluster, server):

        def work() -> tuple[list[bytes], list[bytes], dict[str, int]]:
            direct = client(cluster.uri)
            start = direct.admin.command("ping")["operationTime"]
            direct.admin.command("shardCollection", "sys.c", key={"k": 1})
            direct.sys.c.insert_many([{"_id": i, "k": i} for i in range(5)])
            home = cluster.mongos.sharded["sys.c"].chunks[0].shard
            other = next(sid for sid in sorted(cluster.replsets) if sid != home)
            direct.admin.command("moveRange", "sys.c", toShard=other, min={"k": MinKey()})
            direct.sys.c.insert_one({"_id": "end", "k": 9})

            def events(uri: str) -> list[bytes]:
                # (pymongo's watch() has no showSystemEvents: the commands as a driver sends them.)
                db = client(uri).sys
                cursor = db.command(
                    "aggregate",
                    "c",
                    cursor={},
                    pipeline=[
                        {
                            "$changeStream": {
                                "startAtOperationTime": start,
                                "showExpandedEvents": True,
                                "showSystemEvents": True,
                            }
                        }
                    ],
                )["cursor"]
                out, batch = [], cursor["firstBatch"]
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not any(_is_end(e) for e in out):
                    out += batch
                    batch = db.command("getMore", cursor["id"], collection="c", maxTimeMS=100)[
                        "cursor"
                    ]["nextBatch"]
                db.command("killCursors", "c", cursors=[cursor["id"]])
                return [bson.encode(e) for e in out]

            want = events(cluster.uri)
            got = events(_uri(cluster, server, "accelerated"))
            return want, got, dict(server.engine.watches)

        got = await sync(_outcome, work)
    assert isinstance(got, tuple), got
    want, events, watches = got
    kinds = [bson.decode(e)["operationType"] for e in want]
    assert "migrateLastChunkFromShard" in kinds and events == want
    assert watches == {"accelerated": 1, "passedThrough": 0}
