"""Play a conformance case on one path and return what the consumer saw.

Paths: `simcluster` (a driver's watch() on simcluster's mongos), `watch` (the same watch() through
the proxy with change stream acceleration, checked to be served by the engine) and `buckets` (a
parallelChangeStream of 2 buckets filtered to the case's namespaces, its buckets merged back by
token). Writes always go to mongos directly, so every path reads the same kind of oplog.

A stream is read until an end marker the runner writes after the case's operations (an insert
into the watched collection, or into a collection made before the stream opened), or until an
invalidate; where the case's `$match` may hide the marker, until the expected number of events
and a quiet second after them.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pymongo
from bson import Timestamp
from pymongo.change_stream import ClusterChangeStream, CollectionChangeStream, DatabaseChangeStream
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import OperationFailure

from tests.conformance.environment import Endpoints
from tests.conformance.model import OTHER_SHARD, PRIMARY_SHARD, Case, resolve, substitute, uuid_of

END = "__conformance_end__"
END_COLL = "zz_conformance_end"
_DEADLINE_S = 30.0
_QUIET_S = 1.0
_names = itertools.count()
# $changeStream's fields, as pymongo's watch() names them.
_WATCH_KWARGS = {
    "fullDocument": "full_document",
    "fullDocumentBeforeChange": "full_document_before_change",
    "showExpandedEvents": "show_expanded_events",
    "resumeAfter": "resume_after",
    "startAfter": "start_after",
    "startAtOperationTime": "start_at_operation_time",
}


def fresh_db(path: str) -> str:
    """A database name no other case or path uses."""
    return f"cf{next(_names)}{path[0]}"


def _run(
    client: pymongo.MongoClient[Any], db: str, op: tuple[Any, ...], session: Any = None
) -> None:
    kind, *args = op
    database = client[db]
    if kind == "insert":
        database[args[0]].insert_one(args[1], session=session)
    elif kind == "insert_many":
        database[args[0]].insert_many(args[1], session=session)
    elif kind == "update":
        database[args[0]].update_one(args[1], args[2], session=session)
    elif kind == "update_many":
        database[args[0]].update_many(args[1], args[2], session=session)
    elif kind == "replace":
        database[args[0]].replace_one(args[1], args[2], session=session)
    elif kind == "delete":
        database[args[0]].delete_one(args[1], session=session)
    elif kind == "delete_many":
        database[args[0]].delete_many(args[1], session=session)
    elif kind == "command":  # ("command", {cmd}[, another database])
        client[args[1] if len(args) > 1 else db].command(args[0], session=session)
    elif kind == "admin":
        client.admin.command(args[0], session=session)
    elif kind == "drop":
        database.drop_collection(args[0], session=session)
    elif kind == "txn":
        with client.start_session() as txn_session, txn_session.start_transaction():
            for inner in args[0]:
                _run(client, db, inner, txn_session)
    else:
        raise ValueError(f"unknown operation {kind!r}")


def run_ops(
    client: pymongo.MongoClient[Any],
    db: str,
    ops: tuple[Any, ...],
    shards: dict[str, str] | None = None,
) -> None:
    for op in ops:
        _run(client, db, resolve(substitute(op, db), shards or {}))


def _shards(client: pymongo.MongoClient[Any], db: str) -> dict[str, str]:
    """The case database's primary shard and another shard, for PRIMARY_SHARD and OTHER_SHARD."""
    entry = client.config.databases.find_one({"_id": db})
    assert entry is not None, f"config.databases has no {db}"
    primary = entry["primary"]
    other = next(
        s["_id"] for s in client.admin.command("listShards")["shards"] if s["_id"] != primary
    )
    return {PRIMARY_SHARD: primary, OTHER_SHARD: other}


def _is_end(event: dict[str, Any]) -> bool:
    key = event.get("documentKey")
    return isinstance(key, dict) and key.get("_id") == END


def _write_end(client: pymongo.MongoClient[Any], db: str, case: Case) -> None:
    coll = case.coll if case.watch == "collection" else END_COLL
    client[db][coll].insert_one({"_id": END})


def _done(events: list[dict[str, Any]], case: Case, quiet_since: float) -> bool:
    if events and events[-1].get("operationType") == "invalidate":
        return True
    if case.error is not None and time.monotonic() - quiet_since > 2 * _QUIET_S:
        return True  # the expected error did not come (an error comes with its event's batch)
    if case.prefix and len(events) >= len(case.expect):
        return True
    return (
        len(events) >= len(case.expect)
        and time.monotonic() - quiet_since > _QUIET_S
        and bool(case.pipeline)
    )


def _watch_target(client: pymongo.MongoClient[Any], db: str, case: Case) -> Any:
    database = client[substitute(case.watch_db, db)]
    if case.watch == "collection":
        return database[case.coll]
    return database if case.watch == "database" else client


Played = tuple[str, list[dict[str, Any]] | int, dict[str, Any]]


def play(case: Case, path: str, ends: Endpoints) -> Played:
    """The case's database, the events the path's consumer saw (the end marker left out) or the
    error code opening or reading the stream failed with, and the UUIDs of the database's
    collections after the operations."""
    db = fresh_db(path)
    writer: pymongo.MongoClient[Any] = pymongo.MongoClient(
        ends.mongos_uri, serverSelectionTimeoutMS=10_000
    )
    reader: pymongo.MongoClient[Any] = pymongo.MongoClient(
        ends.mongos_uri if path == "simcluster" else ends.proxy_uri, serverSelectionTimeoutMS=10_000
    )
    try:
        # Made before the stream opens, so that its create event is no part of the case's.
        writer[db][END_COLL].insert_one({"_id": "made before the stream"})
        shards = _shards(writer, db)
        run_ops(writer, db, case.setup, shards)
        # Also the UUIDs of collections the operations drop or replace.
        before = {**shards, **_uuids(writer, db, "before:")}
        options = substitute(case.options, db)
        pipeline = list(substitute(case.pipeline, db))
        if path == "buckets":
            events = _play_buckets(case, writer, reader, db, options, pipeline, shards)
            return db, events, {**before, **_uuids(writer, db)}
        accelerated = (
            reader.admin.command("parallelChangeStreamStatus")["watches"]
            if path == "watch"
            else None
        )
        try:
            stream = _open(reader, db, case, pipeline, options)
        except OperationFailure as exc:
            return db, int(exc.code or 0), {}
        with stream:
            if accelerated is not None:
                after = reader.admin.command("parallelChangeStreamStatus")["watches"]
                assert after["accelerated"] == accelerated["accelerated"] + 1, (
                    "the engine did not serve this watch()"
                )
            run_ops(writer, db, case.ops, shards)
            _write_end(writer, db, case)
            got = _read(stream, case)
        uuids = {**before, **_uuids(writer, db)}
        if case.resume is None or isinstance(got, int):
            return db, got, uuids
        option, index = case.resume
        assert len(got) > index, f"the first stream saw no event {index} to resume from: {got}"
        try:
            again = (
                pipeline
                if case.resume_pipeline is None
                else list(substitute(case.resume_pipeline, db))
            )
            # "startAtOperationTime" starts at the event's cluster time, the others at its token.
            points = {
                name: got[index]["clusterTime" if name == "startAtOperationTime" else "_id"]
                for name in option.split("+")
            }
            resumed = _open(reader, db, case, again, {**options, **points})
        except OperationFailure as exc:
            return db, int(exc.code or 0), uuids
        with resumed:
            return db, _read(resumed, case), uuids
    finally:
        writer.close()
        reader.close()


def _open(
    reader: pymongo.MongoClient[Any],
    db: str,
    case: Case,
    pipeline: list[dict[str, Any]],
    options: dict[str, Any],
) -> Any:
    """A driver's change stream with `options`; those watch() has no argument for (or that it
    would check itself) go into $changeStream as they are."""
    kwargs = {
        _WATCH_KWARGS[name]: value
        for name, value in options.items()
        if name in _WATCH_KWARGS and name not in case.raw_options
    }
    raw = {
        name: value
        for name, value in options.items()
        if name not in _WATCH_KWARGS or name in case.raw_options
    }
    target = _watch_target(reader, db, case)
    if not raw:
        return target.watch(pipeline, **kwargs)
    stream = _raw_stream_class(target, raw)(
        target,
        pipeline,
        kwargs.get("full_document"),
        kwargs.get("resume_after"),
        None,
        None,
        None,
        kwargs.get("start_at_operation_time"),
        None,
        kwargs.get("start_after"),
        None,
        kwargs.get("full_document_before_change"),
        kwargs.get("show_expanded_events"),
    )
    stream._initialize_cursor()  # as watch() does after making its stream
    return stream


def _raw_stream_class(target: Any, raw: dict[str, Any]) -> type[Any]:
    """The driver's stream class for `target`, adding `raw` to the $changeStream stage it sends
    (on its first aggregate and on every resume)."""
    base: type[Any] = (
        CollectionChangeStream
        if isinstance(target, Collection)
        else DatabaseChangeStream
        if isinstance(target, Database)
        else ClusterChangeStream
    )

    def options(stream: Any) -> dict[str, Any]:
        return {**base._change_stream_options(stream), **raw}

    return type(f"Raw{base.__name__}", (base,), {"_change_stream_options": options})


def _uuids(client: pymongo.MongoClient[Any], db: str, prefix: str = "") -> dict[str, Any]:
    """The UUID of each collection of `db`, by its `uuid_of` placeholder."""
    return {
        uuid_of(prefix + c["name"]): c["info"]["uuid"]
        for c in client[db].list_collections()
        if "uuid" in c.get("info", {})
    }


def _read(stream: Any, case: Case) -> list[dict[str, Any]] | int:
    """The stream's events up to the end marker, or the code reading them failed with."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + _DEADLINE_S
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        if not stream._cursor.alive:
            # The server closed the cursor and every event it sent has been read: the shell's
            # isExhausted(), the end of the stream (the jstests' filtered invalidate). pymongo's
            # try_next would resume a closed cursor from its last token instead.
            return events
        try:
            event = stream.try_next()
        except OperationFailure as exc:
            return int(exc.code or 0)
        if event is None:
            if _done(events, case, quiet_since) or not stream.alive:
                return events
            continue
        if _is_end(event):
            return events
        events.append(event)
        quiet_since = time.monotonic()
        if event.get("operationType") == "invalidate":
            return events
    raise AssertionError(f"no end marker within {_DEADLINE_S:.0f} s; events so far: {events}")


def _passing_end(stage: dict[str, Any]) -> dict[str, Any]:
    """A case's $match stage, widened to let the end marker through (the buckets are read until
    it)."""
    return {"$match": {"$or": [{"documentKey._id": END}, stage["$match"]]}}


def _play_buckets(
    case: Case,
    writer: pymongo.MongoClient[Any],
    proxy: pymongo.MongoClient[Any],
    db: str,
    options: dict[str, Any],
    pipeline: list[dict[str, Any]],
    shards: dict[str, str],
) -> list[dict[str, Any]]:
    scope: dict[str, Any] = {"ns.db": db}
    if case.watch == "collection":
        scope["ns.coll"] = {"$in": [case.coll, END_COLL]}
    # startAtOperationTime includes its own time: start just after the last write made.
    last: Timestamp = writer.admin.command("ping")["operationTime"]
    start = Timestamp(last.time, last.inc + 1)
    opened = proxy.admin.command(
        {
            "parallelChangeStream": 1,
            "nBuckets": 2,
            "name": f"conformance-{db}",
            "startAtOperationTime": start,
            "pipeline": [{"$match": scope}, *map(_passing_end, pipeline)],
            **options,
        }
    )
    cursors = {c["id"]: list(c["firstBatch"]) for c in opened["cursors"]}
    try:
        run_ops(writer, db, case.ops, shards)
        writer[db][END_COLL].insert_one({"_id": END})
        seen: dict[str, dict[str, Any]] = {}
        end_token: str | None = None
        deadline = time.monotonic() + _DEADLINE_S
        rounds_after_end = 0
        while rounds_after_end < 2:
            assert time.monotonic() < deadline, (
                f"no end marker within {_DEADLINE_S:.0f} s: {list(seen.values())}"
            )
            for cid, first in cursors.items():
                batch = (
                    first
                    or proxy.admin.command(
                        {
                            "getMore": cid,
                            "collection": "$cmd.parallelChangeStream",
                            "maxTimeMS": 100,
                        }
                    )["cursor"]["nextBatch"]
                )
                cursors[cid] = []
                for event in batch:
                    token = event["_id"]["_data"]
                    if _is_end(event):
                        end_token = token
                    seen.setdefault(token, event)
            if end_token is not None:
                rounds_after_end += 1
        return [e for t, e in sorted(seen.items()) if end_token is None or t < end_token]
    finally:
        proxy.admin.command({"killCursors": "$cmd.parallelChangeStream", "cursors": list(cursors)})
