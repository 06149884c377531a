"""A randomized workload watched through the accelerated proxy and straight from mongos: the two
streams are byte for byte the same, with every fullDocument mode and resumed from random tokens.

Such runs (more seeds, longer workloads: `RANDOM_WATCH_SEEDS=0-20 RANDOM_WATCH_OPS=600`) found
simcluster values that compared equal across types, an updateLookup that matched on `_id` alone,
v2 tokens served for a 5.0 upstream and a shard connection left open by a closing stream; this
keeps one short run in the suite."""

from __future__ import annotations

import datetime
import os
import random
import uuid
from typing import Any

import bson
import pytest
from bson import Binary, Decimal128, Int64, ObjectId
from pymongo.errors import DuplicateKeyError, OperationFailure, WriteError

from tests.conftest import client, sync
from tests.integration.test_accelerate import _collect, accelerated


def _seeds() -> list[int]:
    lo, _, hi = os.environ.get("RANDOM_WATCH_SEEDS", "7").partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _an_id(rng: random.Random, i: int) -> Any:
    return rng.choice(
        [
            i,
            f"s{i}",
            ObjectId(),
            Int64(i * 7),
            i + 0.5,
            Decimal128(f"{i}.25"),
            {"a": i, "b": "x"},
            datetime.datetime(2020, 1, 1) + datetime.timedelta(seconds=i),
            Binary(uuid.UUID(int=rng.getrandbits(128)).bytes, 4),
            -i,
            f"unicodé\u2603{i}",
        ]
    )


_UPDATES = [
    {"$inc": {"v": 1}, "$set": {"arr.1.q": 5, "sub.0.y": 3}},
    {"$unset": {"sub": ""}, "$push": {"arr": {"$each": [9, 10]}}},
    {"$pop": {"arr": 1}, "$rename": {"v": "w"}},
    {"$pull": {"arr": 3}, "$set": {"new.deep.f": [1, 2]}},
    [{"$set": {"v2": {"$add": [1, 2]}, "t": "short"}}],
    {"$set": {"arr.5": "far", "sub.x": None}},
    {"$set": {"m": {"1": {"2": 3}}}},
    {"$set": {"m.1.2": 4, "arr.0": {"z": 1}}},
    {"$inc": {"arr.$[]": 1}},
    {"$unset": {"arr.0": ""}, "$set": {"sub.x": [{"a": 1}]}},
    {"$set": {"0": {"1": "x"}, "sub.0.1": True}},
    [{"$replaceWith": {"$mergeObjects": ["$$ROOT", {"rw": "$v"}]}}],
    [{"$unset": ["t", "sub.0"]}, {"$set": {"u": {"$concat": ["a", "b"]}}}],
    ({"$set": {"arr.$[e].q": 7}}, [{"e.q": {"$gte": 2}}]),
    {"$addToSet": {"arr": {"$each": [1, 99]}}, "$max": {"v": 50}},
    {"$push": {"arr": {"$each": [0], "$position": 0}}, "$mul": {"v": 2}},
]


def _workload(c: Any, rng: random.Random, n: int) -> None:
    c.admin.command("shardCollection", "r0.h", key={"_id": "hashed"})
    c.admin.command("shardCollection", "r1.k", key={"k": 1})
    c.admin.command("split", "r1.k", middle={"k": 500})
    shards = sorted(s["_id"] for s in c.admin.command("listShards")["shards"])
    c.admin.command("moveChunk", "r1.k", find={"k": 900}, to=shards[-1])
    c.r0.command({"collMod": "h", "changeStreamPreAndPostImages": {"enabled": True}})
    colls = [c.r0.h, c.r0.a, c.r2.b, c.r2["d.e"]]
    live: list[tuple[Any, Any]] = []
    for i in range(n):
        op = rng.random()
        if op < 0.35 or not live:
            coll, _id = rng.choice(colls), _an_id(rng, i)
            try:
                coll.insert_one(
                    {
                        "_id": _id,
                        "v": rng.randrange(100),
                        "arr": [1, {"q": 2}, 3],
                        "sub": {"0": {"y": 2}},
                        "t": "y" * rng.randrange(200),
                    }
                )
            except DuplicateKeyError:  # 14 and NumberLong(14) are one _id
                continue
            live.append((coll, _id))
        elif op < 0.4:  # one _id on both shards of r1.k, told apart by k
            c.r1.k.insert_many(
                [{"_id": i, "k": rng.randrange(500)}, {"_id": i, "k": 500 + rng.randrange(500)}]
            )
            c.r1.k.update_many({"_id": i}, {"$inc": {"n": 1}})
        elif op < 0.8:
            coll, _id = rng.choice(live)
            chosen = rng.choice(_UPDATES)
            update, filters = chosen if isinstance(chosen, tuple) else (chosen, None)
            try:
                coll.update_one({"_id": _id}, update, array_filters=filters)
            except WriteError as exc:
                # BadValue ($[] on a missing array), TypeMismatch, PathNotViable: the document is
                # unchanged
                assert exc.code in (2, 14, 28)
        elif op < 0.86:
            coll, _id = rng.choice(live)
            coll.replace_one({"_id": _id}, {"replaced": i})
        elif op < 0.92:
            coll, _id = live.pop(rng.randrange(len(live)))
            coll.delete_one({"_id": _id})
        elif op < 0.97:
            with c.start_session() as s:  # across shards (hashed r0.h) and into another database
                s.with_transaction(
                    lambda s, i=i: (
                        c.r0.h.insert_many(
                            [{"_id": f"tx{i}.{j}"} for j in range(rng.randrange(1, 6))], session=s
                        ),
                        c.r2.b.update_many({}, {"$inc": {"tx": 1}}, session=s),
                    )
                )
        else:
            _ddl(c, rng.randrange(4), i)


def _ddl(c: Any, kind: int, i: int) -> None:
    if kind == 0:
        c.r2.b.create_index("v", name=f"v{i}")
    elif kind == 1:
        try:
            c.r2.command({"collMod": "b", "validationLevel": "moderate"})
        except (
            OperationFailure
        ) as exc:  # r2.b not written yet (seed 104): the server's NamespaceNotFound
            assert exc.code == 26
    elif kind == 2:
        c.r3.command({"create": f"view{i}", "viewOn": "x", "pipeline": []})
    else:
        c.r3[f"t{i}"].insert_one({"_id": 1})
        c.r3[f"t{i}"].rename(f"n{i}")


@pytest.mark.parametrize("seed", _seeds())
async def test_a_random_workload_watched_through_the_proxy_equals_mongos(seed):
    rng = random.Random(seed)
    async with accelerated(shards=3) as (cluster, server):

        def collect(stream: Any) -> list[Any]:
            return _collect(stream, lambda ev: ev["ns"].get("db") == "end")

        def work():
            direct = client(cluster.uri)
            proxied = client(f"mongodb://127.0.0.1:{server.port}/")
            start = direct.admin.command("ping")["operationTime"]
            _workload(direct, rng, int(os.environ.get("RANDOM_WATCH_OPS", "400")))
            direct.end.c.insert_one({"_id": 0})
            base = {"max_await_time_ms": 200, "show_expanded_events": True}
            for images in (
                {},
                {"full_document": "updateLookup"},
                {"full_document": "whenAvailable", "full_document_before_change": "whenAvailable"},
            ):
                want = collect(direct.watch(start_at_operation_time=start, **base, **images))
                got = collect(proxied.watch(start_at_operation_time=start, **base, **images))
                assert len(want) > 250, len(want)
                assert [bson.encode(e) for e in got] == [bson.encode(e) for e in want], images
            for token in (e["_id"] for e in rng.sample(want, 3)):
                for how in ("resume_after", "start_after"):
                    want = collect(direct.watch(**{how: token}, **base))
                    got = collect(proxied.watch(**{how: token}, **base))
                    assert [bson.encode(e) for e in got] == [bson.encode(e) for e in want], how
            assert (
                proxied.admin.command("parallelChangeStreamStatus")["watches"]["passedThrough"] == 0
            )

        await sync(work)
