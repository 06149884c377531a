"""A conformance case: operations, and the change events (or the error) the server's own jstest
says they produce.

Cases are data. Operations are tuples, run through pymongo on the case's own database:

    ("insert", coll, doc)             ("insert_many", coll, [docs])
    ("update", coll, filter, update)  ("update_many", coll, filter, update)
    ("replace", coll, filter, doc)    ("delete", coll, filter)      ("delete_many", coll, filter)
    ("command", {cmd}[, db])          a command on the case's database (or on `db`)
    ("admin", {cmd})                  a command on admin
    ("drop", coll)                    ("txn", [operations])        in one transaction

Every string holding `<db>` (a namespace, an `ns` in an expected event) names the case's
database, which the runner chooses. Expected events hold the fields the jstest states; as the
jstests' own comparison does (`assertChangeStreamEventEq` in jstests/libs/change_stream_util.js),
`_id`, `clusterTime`, `wallTime`, `collectionUUID`, `lsid`, `txnNumber`, `operationDescription` and
`updateDescription` are compared only when the expected event gives them (the fields its
`canonicalizeEventForTesting` drops), and field order is not compared.

Two placeholders stand for values a case cannot know in advance: `PRESENT` (the field must be
there, with any value; the jstests' `assert(event.collectionUUID)`) and `uuid_of(coll)` (the
UUID of the case's collection `coll` as listCollections gives it after the operations, or with
`coll` = "before:NAME" before them; the jstests' `getCollectionUuid`). `PRIMARY_SHARD` and
`OTHER_SHARD`, in operations and expected events, name the case database's primary shard and
another shard (the jstests' `st.shard0.shardName` after `ensurePrimaryShard`).

A case with `resume` opens its stream twice: the first stream reads the operations' events, and
`expect` (or `error`) is then about a second stream opened with `resume[0]` ("resumeAfter" or
"startAfter") set to the token of the first stream's event number `resume[1]`, or
"startAtOperationTime" set to its cluster time; several options are joined with "+".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DB = "<db>"
VERSIONS = ("7.0", "8.0")
# The fields compared only when an expected event states them.
IGNORED_UNLESS_GIVEN = (
    "_id",
    "clusterTime",
    "wallTime",
    "collectionUUID",
    "lsid",
    "txnNumber",
    "operationDescription",
    "updateDescription",
)
PRESENT = "<present>"
UUID_PREFIX = "<uuid:"
# The shard id of the case database's primary shard, and of another shard.
PRIMARY_SHARD = "<primary-shard>"
OTHER_SHARD = "<other-shard>"


def uuid_of(coll: str) -> str:
    """A placeholder for the UUID of the case's collection `coll`."""
    return f"{UUID_PREFIX}{coll}>"


@dataclass(frozen=True)
class Case:
    name: str
    source: str  # the jstest it comes from, as a path in mongodb/mongo
    watch: str  # "collection" (of `coll`), "database" or "cluster"
    ops: tuple[Any, ...]  # run after the stream is opened
    expect: tuple[dict[str, Any], ...] = ()
    error: int | None = None  # the code opening or reading the stream fails with
    setup: tuple[Any, ...] = ()  # run before the stream is opened
    options: dict[str, Any] = field(default_factory=dict)  # $changeStream's fields
    pipeline: tuple[dict[str, Any], ...] = ()  # stages after $changeStream
    coll: str = "c"
    versions: tuple[str, ...] = VERSIONS
    # Whether the case also runs through parallelChangeStream buckets: a cluster-wide stream
    # filtered to the case's namespaces, which has no invalidate and takes only $match stages.
    buckets: bool = True
    unordered: bool = False  # the jstest compares the events as a set
    prefix: bool = False  # the jstest reads only the first len(expect) events
    # Paths known to differ from the server, each with the reason (the fidelity audit's item,
    # e.g. "D10: ..."): run as strict xfails, so that a fix shows up as an unexpected pass.
    diverges: dict[str, str] = field(default_factory=dict)
    resume: tuple[str, int] | None = None  # ("resumeAfter" | "startAfter" | ..., event index)
    resume_pipeline: tuple[dict[str, Any], ...] | None = (
        None  # the resumed stream's, if not `pipeline`
    )
    watch_db: str = DB  # the database a collection or database stream watches
    # Options sent in $changeStream as they are, not through watch()'s arguments (which has none
    # for some, and checks the types of others itself).
    raw_options: tuple[str, ...] = ()

    @property
    def paths(self) -> tuple[str, ...]:
        every = ("simcluster", "watch")
        invalidates = any(e.get("operationType") == "invalidate" for e in self.expect)
        only_match = all(set(stage) == {"$match"} for stage in self.pipeline)
        plain = self.resume is None and self.watch_db == DB
        if self.buckets and self.error is None and not invalidates and only_match and plain:
            return (*every, "buckets")
        return every


def substitute(value: Any, db: str) -> Any:
    """`value` with `<db>` replaced by `db` in every string, key and value alike."""
    if isinstance(value, str):
        return value.replace(DB, db)
    if isinstance(value, dict):
        return {substitute(k, db): substitute(v, db) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(substitute(v, db) for v in value)
    return value


def comparable(actual: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """`actual` without the fields the comparison ignores unless `expected` states them, and with
    `PRESENT` for the fields `expected` only requires to be there."""
    return {
        k: PRESENT if expected.get(k) == PRESENT else v
        for k, v in actual.items()
        if k not in IGNORED_UNLESS_GIVEN or k in expected
    }


def resolve(value: Any, names: dict[str, Any]) -> Any:
    """`value` with every placeholder string that `names` holds (`uuid_of(coll)`, `PRIMARY_SHARD`,
    `OTHER_SHARD`) replaced by its value."""
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, dict):
        return {k: resolve(v, names) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(resolve(v, names) for v in value)
    return value
