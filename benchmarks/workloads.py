"""Backlogs that look like applications' writes, for the catch-up benchmarks.

Written through unmodified pymongo and mongos, so the oplog holds what a server's would for the
same writes: `$v: 2` diffs with nested and array sections, replacements, deletes routed by shard
key, `insertMany` batches and multi-document transactions. A seed makes every backlog the same
from run to run.

- `app`: four collections of realistic documents (0.3 to 4 KB, nested subdocuments, arrays,
  strings of varied length; `_id`s that are ObjectIds, strings, UUIDs and compound documents) and
  the update forms applications use: nested `$set`, `$push`/`$pull`/`$addToSet`, `$inc`,
  `$unset`, `$rename`, a `$set` of an array element, pipeline updates and replacements; deletes;
  a few transactions; a few large (100 KB to 1 MB) documents.
- `ycsb`: YCSB's update-heavy workload A: records of 10 fields of 100 bytes, then updates of one
  field each, keys chosen with a Zipfian distribution. Its reads (half of workload A's
  operations) write nothing to the oplog, so the backlog holds the updates alone.

Every write changes its document (each update also bumps a `version` field), so each one is
exactly one change event: `write_workload` returns how many events the backlog holds.
"""

from __future__ import annotations

import itertools
import random
import string
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pymongo
from bson import Binary, ObjectId
from pymongo import DeleteOne, InsertOne, ReplaceOne, UpdateOne

WORKLOADS = ("app", "ycsb")
_BULK = 500  # operations per bulk write
_TXN_SHARE = 0.01  # of the app mix's operations, in transactions of 2 to 5 writes
_LARGE_SHARE = 0.0005  # of the app mix's inserts, 100 KB to 1 MB documents
_WORDS = [
    "alpha",
    "bravo",
    "coffee",
    "delta",
    "echo",
    "forest",
    "garden",
    "harbor",
    "island",
    "jungle",
    "kitten",
    "lemon",
    "meadow",
    "nectar",
    "orbit",
    "pepper",
    "quartz",
    "river",
    "salmon",
    "tiger",
    "umber",
    "violet",
    "walnut",
    "xenon",
    "yellow",
    "zephyr",
]


def _text(rng: random.Random, low: int, high: int) -> str:
    """Words up to a length between `low` and `high` characters."""
    want = rng.randint(low, high)
    out: list[str] = []
    size = 0
    while size < want:
        word = rng.choice(_WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:want]


def _token(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase + string.digits, k=12))


@dataclass
class _Collection:
    """A collection of the app mix: how to make its documents, and the `_id`s alive in it."""

    name: str
    make_id: Callable[[random.Random, int], Any]
    make_doc: Callable[[random.Random], dict[str, Any]]
    live: list[Any] = field(default_factory=list)


def _address(rng: random.Random) -> dict[str, Any]:
    return {
        "street": f"{rng.randint(1, 999)} {_text(rng, 6, 20)}",
        "city": rng.choice(_WORDS).title(),
        "zip": f"{rng.randint(10000, 99999)}",
        "geo": {"lat": rng.uniform(-90, 90), "lon": rng.uniform(-180, 180)},
    }


def _order(rng: random.Random) -> dict[str, Any]:
    return {
        "status": rng.choice(["new", "paid", "packed", "shipped"]),
        "version": 0,
        "customer": {
            "name": _text(rng, 8, 30),
            "email": f"{_token(rng)}@example.com",
            "address": _address(rng),
        },
        "items": [
            {
                "sku": _token(rng),
                "qty": rng.randint(1, 5),
                "price": round(rng.uniform(1, 500), 2),
                "title": _text(rng, 10, 80),
            }
            for _ in range(rng.randint(1, 8))
        ],
        "notes": _text(rng, 0, 1500),
        "tags": rng.sample(_WORDS, rng.randint(0, 5)),
    }


def _user(rng: random.Random) -> dict[str, Any]:
    return {
        "version": 0,
        "profile": {
            "first": rng.choice(_WORDS).title(),
            "last": rng.choice(_WORDS).title(),
            "bio": _text(rng, 50, 3200),
            "age": rng.randint(18, 90),
        },
        "addresses": [_address(rng) for _ in range(rng.randint(1, 3))],
        "prefs": {
            "lang": rng.choice(["en", "fr", "de", "ja"]),
            "mail": {"news": rng.random() < 0.5, "digest": rng.choice(["d", "w"])},
        },
        "tags": rng.sample(_WORDS, rng.randint(1, 8)),
        "logins": rng.randint(0, 1000),
    }


def _session(rng: random.Random) -> dict[str, Any]:
    return {
        "version": 0,
        "user": _token(rng),
        "agent": _text(rng, 80, 200),
        "pages": [
            {"path": "/" + "/".join(rng.sample(_WORDS, 3)), "ms": rng.randint(5, 5000)}
            for _ in range(rng.randint(3, 40))
        ],
        "active": True,
    }


def _stock(rng: random.Random) -> dict[str, Any]:
    return {
        "version": 0,
        "qty": rng.randint(0, 10_000),
        "reserved": rng.randint(0, 50),
        "title": _text(rng, 60, 200),
        "attrs": {w: _text(rng, 3, 30) for w in rng.sample(_WORDS, rng.randint(2, 12))},
        "history": [
            {"delta": rng.randint(-20, 20), "by": _token(rng)} for _ in range(rng.randint(1, 20))
        ],
    }


def _app_collections() -> list[_Collection]:
    return [
        _Collection("orders", lambda rng, i: ObjectId(), _order),
        _Collection(
            "users",
            lambda rng, i: Binary.from_uuid(uuid.UUID(int=rng.getrandbits(128), version=4)),
            _user,
        ),
        _Collection("sessions", lambda rng, i: f"sess-{i:09d}-{_token(rng)}", _session),
        _Collection(
            "stock", lambda rng, i: {"store": rng.randint(1, 40), "sku": f"sku-{i:08d}"}, _stock
        ),
    ]


def _app_update(rng: random.Random, coll: str) -> dict[str, Any] | list[dict[str, Any]]:
    """One application-like update of a document of `coll`; every form also bumps `version`, so
    that the update always changes the document."""
    bump = {"$inc": {"version": 1}}
    form = rng.randrange(10)
    if coll == "orders":
        updates: list[dict[str, Any]] = [
            {
                "$set": {
                    "status": rng.choice(["paid", "packed", "shipped", "done"]),
                    "customer.address.city": rng.choice(_WORDS).title(),
                }
            },
            {
                "$push": {
                    "items": {
                        "sku": _token(rng),
                        "qty": rng.randint(1, 3),
                        "price": 9.99,
                        "title": _text(rng, 5, 40),
                    }
                }
            },
            {"$pull": {"tags": rng.choice(_WORDS)}},
            {"$addToSet": {"tags": rng.choice(_WORDS)}},
            {"$set": {"items.0.qty": rng.randint(1, 9)}},
            {"$unset": {"notes": ""}},
            {"$set": {"notes": _text(rng, 10, 300)}},
        ]
    elif coll == "users":
        updates = [
            {"$set": {"profile.bio": _text(rng, 50, 800)}},
            {"$inc": {"logins": 1}},
            {
                "$set": {
                    "prefs.mail.news": rng.random() < 0.5,
                    "prefs.lang": rng.choice(["en", "fr"]),
                }
            },
            {"$push": {"addresses": _address(rng)}},
            {"$rename": {"tags": "labels"}},
            {"$rename": {"labels": "tags"}},
            {"$set": {"addresses.0.zip": f"{rng.randint(10000, 99999)}"}},
        ]
    elif coll == "sessions":
        updates = [
            {"$push": {"pages": {"path": "/" + rng.choice(_WORDS), "ms": rng.randint(5, 900)}}},
            {"$set": {"active": False}},
            {"$set": {"pages.0.ms": rng.randint(1, 99)}},
        ]
    else:
        updates = [
            {"$inc": {"qty": rng.randint(-5, 5), "reserved": 1}},
            {"$push": {"history": {"delta": rng.randint(-9, 9), "by": _token(rng)}}},
            {"$set": {f"attrs.{rng.choice(_WORDS)}": _text(rng, 3, 20)}},
        ]
    if form == 9:  # a pipeline update: a new status and etag computed server-side
        return [
            {
                "$set": {
                    "etag": _token(rng),
                    "version": {"$literal": rng.randint(1, 10**9)},
                    "summary": {"$concat": [_text(rng, 3, 10), "-", _token(rng)]},
                }
            }
        ]
    update = rng.choice(updates)
    if "$inc" in update:
        return {**update, "$inc": {**update["$inc"], "version": 1}}
    return {**update, **bump}


def _app_ops(
    seed: int, writes: int
) -> Iterator[tuple[str, Any] | tuple[str, list[tuple[str, Any]]]]:
    """(collection, pymongo write) pairs, or ("txn", [(collection, write), ...]) for a
    transaction."""
    rng = random.Random(seed)
    colls = _app_collections()
    counter = itertools.count()
    done = 0

    def insert(c: _Collection) -> Any:
        doc = c.make_doc(rng)
        doc["_id"] = c.make_id(rng, next(counter))
        if rng.random() < _LARGE_SHARE:
            doc["blob"] = "x" * rng.randint(100_000, 1_000_000)
        c.live.append(doc["_id"])
        return InsertOne(doc)

    def change(c: _Collection) -> Any:
        pick = rng.randrange(len(c.live))
        key = c.live[pick]
        roll = rng.random()
        if roll < 0.08:  # a delete
            c.live[pick] = c.live[-1]
            c.live.pop()
            return DeleteOne({"_id": key})
        if roll < 0.16:  # a replacement
            doc = c.make_doc(rng)
            doc["version"] = rng.randint(1, 10**9)
            return ReplaceOne({"_id": key}, doc)
        return UpdateOne({"_id": key}, _app_update(rng, c.name))

    while done < writes:
        c = rng.choice(colls)
        if rng.random() < _TXN_SHARE and all(len(x.live) > 10 for x in colls):
            size = min(rng.randint(2, 5), writes - done)
            txn = []
            for _ in range(size):
                other = rng.choice(colls)
                txn.append((other.name, change(other) if rng.random() < 0.7 else insert(other)))
            done += size
            yield "txn", txn
            continue
        # Inserts first fill each collection a little; later about a third of the writes are
        # inserts (some of them insertMany batches) and the rest changes.
        if len(c.live) < 50 or rng.random() < 0.2:
            if rng.random() < 0.05:  # an insertMany batch
                batch = min(rng.randint(5, 50), writes - done)
                for _ in range(batch):
                    yield c.name, insert(c)
                done += batch
                continue
            yield c.name, insert(c)
        else:
            yield c.name, change(c)
        done += 1


def _ycsb_ops(seed: int, writes: int) -> Iterator[tuple[str, Any]]:
    """YCSB workload A's writes: a load of records (10 fields of 100 bytes), then updates of one
    field each, over keys chosen by a Zipfian distribution (constant 0.99, as YCSB's)."""
    rng = random.Random(seed)
    records = max(1, writes // 4)
    for i in range(records):
        doc = {"_id": f"user{i:010d}", **{f"field{f}": _token(rng) * 8 + "abcd" for f in range(10)}}
        yield "usertable", InsertOne(doc)
    weights = list(itertools.accumulate(1 / (k + 1) ** 0.99 for k in range(records)))
    order = list(range(records))
    rng.shuffle(order)  # the hot keys spread over the key space, as YCSB's hashed insert order does
    for _ in range(writes - records):
        key = order[rng.choices(range(records), cum_weights=weights)[0]]
        value = "".join(rng.choices(string.ascii_letters, k=100))
        yield (
            "usertable",
            UpdateOne({"_id": f"user{key:010d}"}, {"$set": {f"field{rng.randrange(10)}": value}}),
        )


def write_workload(uri: str, workload: str, writes: int, *, seed: int = 1, db: str = "app") -> int:
    """Write `writes` writes of `workload` through mongos at `uri` into `db`'s hashed-sharded
    collections; returns the change events they make (one per write)."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri)
    try:
        client.admin.command("enableSharding", db)
        ops = _app_ops(seed, writes) if workload == "app" else _ycsb_ops(seed, writes)
        pending: dict[str, list[Any]] = {}
        sharded: set[str] = set()
        events = 0
        for name, op in ops:
            if name == "txn":
                _flush(client[db], pending)
                with client.start_session() as session, session.start_transaction():
                    for coll, write in op:
                        if coll not in sharded:
                            client.admin.command(
                                "shardCollection", f"{db}.{coll}", key={"_id": "hashed"}
                            )
                            sharded.add(coll)
                        client[db][coll].bulk_write([write], session=session)
                events += len(op)
                continue
            if name not in sharded:
                client.admin.command("shardCollection", f"{db}.{name}", key={"_id": "hashed"})
                sharded.add(name)
            pending.setdefault(name, []).append(op)
            events += 1
            if len(pending[name]) >= _BULK:
                _flush(client[db], pending)
        _flush(client[db], pending)
        return events
    finally:
        client.close()


def _flush(database: Any, pending: dict[str, list[Any]]) -> None:
    """Send every collection's pending writes, in the order they were made within each."""
    for name, writes in pending.items():
        if writes:
            database[name].bulk_write(writes, ordered=True)
    pending.clear()
