"""The replication sink (bucketspark.sink.apply_events) against simclusters, without Spark: a
source's change events, read with pymongo (expanded events, as the Spark source reads them),
applied to a target, which must then hold the source's documents byte for byte
(bucketspark.verify), also when the events are applied twice (a replayed micro-batch).

The awkward names come from the manual's "Field Names with Periods and Dollar Signs": a field
whose name holds a dot or starts with $ is set with $setField/$literal in a pipeline update; an
update's dotted path cannot name it, and a top-level $-prefixed field cannot be stored by a
replacement or $set of an existing document (DollarPrefixedFieldName, storage_validation.cpp).
"""

from __future__ import annotations

from typing import Any

import pymongo

from bucketspark.sink import apply_events
from bucketspark.verify import document_differences
from simcluster import open_cluster
from tests.conftest import _close_all, client, sync


def _set_field(name: str, value: Any, on: Any = "$$ROOT") -> dict[str, Any]:
    return {"$setField": {"field": {"$literal": name}, "input": on, "value": {"$literal": value}}}


def _workload(c: pymongo.MongoClient[Any]) -> None:
    """Documents with dotted, $-prefixed and numeric field names, arrays that grow and shrink,
    replaces and deletes, each change made as an application would make it."""
    coll = c.sink.docs
    pad = "p" * 300  # a server logs a diff only where it is smaller than the new value
    coll.insert_many(
        [
            {
                "_id": 1,
                "hosts": {"a": 1, "pad": pad},
                "n": {"0": "zero", "1": "one", "pad": pad},
                "arr": list(range(20)),
                "objs": [{"x": 1, "pad": pad}, {"x": 2, "pad": pad}],
                "pad": pad,
            },
            {
                "_id": 2,
                "$rooms": {"br": 2},
                "v": 1,
                "pad": pad,
            },  # top-level $: only an insert stores it
            {
                "_id": 3,
                "arr": list(range(30)),
                "sub": {"a": 1, "pad": pad},
                "doomed": True,
                "pad": pad,
            },
            {"_id": 4, "keep": 1, "pad": pad},
        ]
    )
    # A top-level field whose name holds a dot, set, changed and removed.
    coll.update_one({"_id": 1}, [{"$replaceWith": _set_field("hosts.example.com", 1)}])
    coll.update_one({"_id": 1}, [{"$replaceWith": _set_field("hosts.example.com", 2)}])
    coll.update_one({"_id": 4}, [{"$replaceWith": _set_field("gone.soon", 1)}])
    coll.update_one(
        {"_id": 4}, [{"$replaceWith": {"$unsetField": {"field": "gone.soon", "input": "$$ROOT"}}}]
    )
    # Such a field inside a subdocument, and inside an array's element.
    coll.update_one({"_id": 1}, [{"$set": {"hosts": _set_field("db.example.com", True, "$hosts")}}])
    coll.update_one({"_id": 1}, [{"$set": {"hosts": _set_field("old.example.com", 1, "$hosts")}}])
    coll.update_one(
        {"_id": 1},
        [{"$set": {"hosts": {"$unsetField": {"field": "old.example.com", "input": "$hosts"}}}}],
    )
    coll.update_one(
        {"_id": 1},
        [
            {
                "$set": {
                    "objs": {
                        "$concatArrays": [
                            [{"$arrayElemAt": ["$objs", 0]}],
                            [_set_field("p.q", 7, {"$arrayElemAt": ["$objs", 1]})],
                        ]
                    }
                }
            }
        ],
    )
    # $-prefixed names: a top-level one set by a pipeline, a nested one changed by $set.
    coll.update_one({"_id": 2}, [{"$replaceWith": _set_field("$price", 50)}])
    coll.update_one({"_id": 2}, {"$set": {"$rooms.br": 3, "v": 2}})
    # Numeric keys of an object beside indices of an array, in one update.
    coll.update_one({"_id": 1}, {"$set": {"n.1": "uno", "n.2": "dos", "arr.3": 33}})
    # An array cut short with its first element changed, beside a dotted name (one pipeline),
    # and alone (truncatedArrays and an index of the same array).
    coll.update_one(
        {"_id": 1},
        [
            {"$set": {"arr": {"$concatArrays": [[100], {"$slice": ["$arr", 1, 9]}]}}},
            {"$replaceWith": _set_field("hosts.example.com", 3)},
        ],
    )
    coll.update_one(
        {"_id": 3}, [{"$set": {"arr": {"$concatArrays": [[-1], {"$slice": ["$arr", 1, 14]}]}}}]
    )
    coll.update_one(
        {"_id": 3}, {"$push": {"arr": {"$each": [], "$slice": 12}}, "$unset": {"doomed": ""}}
    )
    # An array grown past its end: the elements between are nulls.
    coll.update_one({"_id": 3}, {"$set": {"arr.15": "far"}})
    # ... in the same update as a nested $-prefixed name (which $set may store): one pipeline.
    coll.update_one({"_id": 3}, {"$set": {"arr.20": "farther", "sub.$z": 2}})
    # Many dotted names in one update (more than one $replaceWith stage's worth).
    many: Any = "$$ROOT"
    for i in range(60):
        many = {"$setField": {"field": f"k.{i}", "input": many, "value": i}}
    coll.update_one({"_id": 4}, [{"$replaceWith": many}])
    # A whole new document holding a top-level $ field, and deletes.
    coll.update_one(
        {"_id": 2}, [{"$replaceWith": {"$literal": {"_id": 2, "$rooms": {"br": 4}, "w": [1, 2]}}}]
    )
    coll.insert_one({"_id": 5, "tmp": 1})
    coll.delete_one({"_id": 5})
    c.sink.other.insert_one({"_id": "x", "a.b": {"$c": 1}})
    c.sink.other.update_one(
        {"_id": "x"}, [{"$set": {"a.b": 1}}]
    )  # a $set stage's dotted path nests


def _events(c: pymongo.MongoClient[Any], start: Any) -> list[dict[str, Any]]:
    out = []
    with c.watch(
        start_at_operation_time=start, show_expanded_events=True, max_await_time_ms=200
    ) as stream:
        while (ev := stream.try_next()) is not None or not out:
            if ev is not None:
                out.append(ev)
    return out


async def test_the_target_holds_the_sources_documents_exactly() -> None:
    async with open_cluster(shards=2) as source, open_cluster(shards=1) as target:

        def work() -> list[str]:
            s, t = client(source.uri), client(target.uri)
            start = s.admin.command("ping")["operationTime"]
            _workload(s)
            events = _events(s, start)
            kinds = [e["operationType"] for e in events]
            assert kinds.count("update") >= 17 and "replace" in kinds and "delete" in kinds, kinds
            described = [e["updateDescription"] for e in events if e["operationType"] == "update"]
            assert any(
                d["truncatedArrays"] and any(k.startswith("arr.") for k in d["updatedFields"])
                for d in described
            ), "an array cut short and changed in one update"
            assert any("hosts.example.com" in d["disambiguatedPaths"] for d in described)
            apply_events(t, events)
            first = document_differences(s, t)
            apply_events(t, events)  # a replayed batch leaves the same state
            return first + document_differences(s, t)

        assert await sync(work) == []
        await sync(_close_all)


async def test_a_task_reads_kind_and_token_from_the_event_column_and_stops_at_a_barrier() -> None:
    """replicate_batch hands its tasks two columns, bucket and event (bucketspark.sink
    _SINK_COLUMNS): a task decodes each event once and takes its kind and token from it. It
    applies the events before the first cross-bucket one (a rename, by namespace) and reports
    that one's token and bytes for the driver to apply once."""
    import bson
    import pyarrow as pa

    from bucketspark.sink import replicate_arrow

    async with open_cluster(shards=1) as source, open_cluster(shards=1) as target:

        def work() -> None:
            s, t = client(source.uri), client(target.uri)
            start = s.admin.command("ping")["operationTime"]
            s.sink.a.insert_many([{"_id": i} for i in range(3)])
            s.admin.command({"renameCollection": "sink.a", "to": "sink.b"})
            s.sink.b.insert_one({"_id": 3})
            events = [e for e in _events(s, start) if e["operationType"] in ("insert", "rename")]
            raws = [bson.encode(e) for e in events]
            batch = pa.RecordBatch.from_pydict(
                {"bucket": [0] * len(raws), "event": raws},
                schema=pa.schema([("bucket", pa.int32()), ("event", pa.binary())]),
            )
            (out,) = replicate_arrow(target.uri)([batch])
            row = out.to_pylist()[0]
            rename = events[3]
            assert rename["operationType"] == "rename"
            assert row["applied"] == 3 and row["barrierToken"] == rename["_id"]["_data"]
            assert bson.decode(row["barrierEvent"]) == bson.decode(raws[3])
            assert sorted(d["_id"] for d in t.sink.a.find()) == [0, 1, 2]

        await sync(work)
        await sync(_close_all)
