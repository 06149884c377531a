"""Replicate change events into a target MongoDB: what each Spark task does with its bucket.

Events arrive per bucket in token order. Bucketed by namespace, every namespace's events are in
order in one bucket; bucketed by documentKey, every document's are, and each DDL event is in every
bucket (buckets/bucketing.py). DML is gathered per namespace into ordered bulk writes; DDL writes
what was gathered, then applies on its own. Applying a documentKey-bucketed stream needs only
per-document order for DML, but its DDL is a barrier across buckets: `replicate_batch` stops every
bucket before it and applies it once.

Idempotent on replay (a re-applied batch leaves the same state):
- insert/replace -> replaceOne(documentKey, fullDocument, upsert): a replayed insert is no
  duplicate-key error, and no update ever needs the (possibly null) post-image (a document with a
  top-level field starting with $ is upserted by a pipeline's $replaceWith instead);
- update -> $set/$unset (+ $push/$slice for truncated arrays) from updateDescription, or, when a
  path holds a field name with a dot or a leading $, an update pipeline addressing the exact
  paths of disambiguatedPaths (`update_ops`); never upsert: replaying an update after a later
  delete leaves the document deleted;
- delete -> deleteOne(documentKey); DDL ignores "already done" errors (NamespaceExists,
  NamespaceNotFound, IndexNotFound, IndexAlreadyExists).
"""

from __future__ import annotations

import functools
import operator
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import bson
import pymongo
from pymongo import DeleteOne, ReplaceOne, UpdateOne
from pymongo.errors import OperationFailure

from bucketspark.client import client_for, settle_worker_heap
from bucketspark.update_writes import update_ops
from mongoformats.codecs import PLAIN

_ALREADY_DONE = {
    26,
    27,
    48,
    68,
    85,
    86,
}  # NamespaceNotFound, IndexNotFound, NamespaceExists, Index*


@dataclass
class ApplyStats:
    applied: int = 0
    ddl: int = 0
    by_type: dict[str, int] = field(default_factory=dict)


# Checks a field name without a Python frame per field: this runs once per inserted document.
_DOLLAR_PREFIXED = operator.methodcaller("startswith", "$")


# A write that applies a DML event (bulk_write's request types).
WriteOp = DeleteOne | ReplaceOne[Any] | UpdateOne


def _replace_op(key: Mapping[str, Any], doc: Mapping[str, Any]) -> WriteOp:
    """Upsert the whole document. A replacement may not hold a top-level field starting with $
    (DollarPrefixedFieldName, where it replaces a document); a pipeline's $replaceWith may."""
    if any(map(_DOLLAR_PREFIXED, doc)):
        return UpdateOne(key, [{"$replaceWith": {"$literal": doc}}], upsert=True)
    return ReplaceOne(key, doc, upsert=True)


def dml_ops(ev: Mapping[str, Any]) -> list[WriteOp]:
    kind = ev["operationType"]
    key = ev["documentKey"]
    if kind in ("insert", "replace"):
        return [_replace_op(key, ev["fullDocument"])]
    if kind == "update":
        return [*update_ops(key, ev["updateDescription"])]
    if kind == "delete":
        return [DeleteOne(key)]
    raise ValueError(kind)


# How each DDL event is replayed on the target: (client, the event's database, its namespace,
# the event, its operationDescription). Kinds without an entry are not replayed: shardCollection
# (the target's sharding layout is the operator's choice), and those the target makes itself.
_DdlStep = Callable[
    [pymongo.MongoClient[Any], Any, Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]],
    None,
]


def _rename(
    client: pymongo.MongoClient[Any],
    db: Any,
    ns: Mapping[str, Any],
    ev: Mapping[str, Any],
    desc: Mapping[str, Any],
) -> None:
    to = ev["to"]
    client.admin.command(
        {
            "renameCollection": f"{ns['db']}.{ns['coll']}",
            "to": f"{to['db']}.{to['coll']}",
            "dropTarget": True,
        }
    )


def _drop_indexes(
    client: pymongo.MongoClient[Any],
    db: Any,
    ns: Mapping[str, Any],
    ev: Mapping[str, Any],
    desc: Mapping[str, Any],
) -> None:
    for spec in desc.get("indexes", []):
        db.command({"dropIndexes": ns["coll"], "index": spec["name"]})


_DDL: dict[str, _DdlStep] = {
    "drop": lambda client, db, ns, ev, desc: db.drop_collection(ns["coll"]),
    "dropDatabase": lambda client, db, ns, ev, desc: client.drop_database(ns["db"]),
    "rename": _rename,
    "create": lambda client, db, ns, ev, desc: db.command(
        {"create": ns["coll"], **{k: v for k, v in desc.items() if k != "idIndex"}}
    ),
    "createIndexes": lambda client, db, ns, ev, desc: db.command(
        {"createIndexes": ns["coll"], "indexes": desc.get("indexes", [])}
    ),
    "dropIndexes": _drop_indexes,
    "modify": lambda client, db, ns, ev, desc: db.command({"collMod": ns["coll"], **desc}),
}


def apply_ddl(client: pymongo.MongoClient[Any], ev: Mapping[str, Any]) -> None:
    ns = ev["ns"]
    db = client[ns["db"]]
    desc = ev.get("operationDescription") or {}
    step = _DDL.get(ev["operationType"])
    try:
        if step is not None:
            step(client, db, ns, ev, desc)
    except OperationFailure as exc:
        if exc.code not in _ALREADY_DONE:
            raise


DML = frozenset({"insert", "update", "replace", "delete"})


FLUSH_OPS = 1000  # ops per namespace held before they are written: bounds a task's memory


def _txn_key(ev: Mapping[str, Any]) -> tuple[bytes, int] | None:
    if "txnNumber" not in ev or "lsid" not in ev:
        return None
    return bytes(ev["lsid"]["id"]), int(ev["txnNumber"])


def _write_unit(client: pymongo.MongoClient[Any], ops: list[tuple[tuple[str, str], Any]]) -> None:
    """A source transaction's events (this bucket's share of it) as one target transaction, so a
    reader of the target never sees half of it; plainly where the target has no transactions."""
    by_ns: dict[tuple[str, str], list[Any]] = {}
    for ns, op in ops:
        by_ns.setdefault(ns, []).append(op)

    def body(session: Any) -> None:
        for (db, coll), run in by_ns.items():
            client[db][coll].bulk_write(run, ordered=True, session=session)

    with client.start_session() as session:
        try:
            session.with_transaction(body)
        except OperationFailure as exc:
            if exc.code != 20:  # IllegalOperation: a standalone target cannot run transactions
                raise
            body(None)


def apply_events(
    client: pymongo.MongoClient[Any], events: Iterable[Mapping[str, Any] | bytes]
) -> ApplyStats:
    """Apply events (decoded dicts or raw BSON) in order to the target cluster behind `client`.

    DML is gathered per namespace and written as ordered bulk writes: the order that matters is
    each namespace's own (a bucket interleaves several), so a bucket whose namespaces alternate
    still gets 1000-op bulk writes instead of one round trip per event. A DDL event writes
    everything gathered before it, then applies, so it stays a barrier. The events of one source
    transaction (consecutive in a bucket: same lsid and txnNumber) are written as one target
    transaction, after what was gathered before them. The writes go to the target in that order
    from one writer thread (`_Writer`), while the events after them are converted.
    """
    applier = _Applier(client)
    try:
        for raw in events:
            applier.apply(bson.decode(raw, PLAIN) if isinstance(raw, (bytes, bytearray)) else raw)
        applier.end_unit()
        applier.flush()
        applier.writer.drain()
    finally:
        applier.writer.close()
    return applier.stats


class _Applier:
    """apply_events' state: the DML gathered per namespace, and the source transaction whose
    events are being gathered (its key, and its writes in order)."""

    def __init__(self, client: pymongo.MongoClient[Any]) -> None:
        self.client = client
        self.stats = ApplyStats()
        self.runs: dict[tuple[str, str], list[Any]] = {}
        self.unit: list[tuple[tuple[str, str], Any]] = []
        self.unit_key: tuple[bytes, int] | None = None
        self.writer = _Writer()

    def apply(self, ev: Mapping[str, Any]) -> None:
        kind = ev["operationType"]
        self.stats.by_type[kind] = self.stats.by_type.get(kind, 0) + 1
        txn = _txn_key(ev) if kind in DML else None
        if txn != self.unit_key:
            self.end_unit()
            self.unit_key = txn
        if kind in DML:
            self._gather(ev, txn)
            self.stats.applied += 1
        elif kind != "invalidate":
            self.flush()
            self.writer.drain()
            apply_ddl(self.client, ev)
            self.stats.ddl += 1

    def _gather(self, ev: Mapping[str, Any], txn: tuple[bytes, int] | None) -> None:
        """A DML event's writes, into its transaction's or its namespace's; a namespace's are
        written once FLUSH_OPS are held."""
        ns = (ev["ns"]["db"], ev["ns"]["coll"])
        ops = dml_ops(ev)
        if txn is not None:
            self.unit.extend((ns, op) for op in ops)
        elif ops:
            run = self.runs.setdefault(ns, [])
            run.extend(ops)
            if len(run) >= FLUSH_OPS:
                self.flush(ns)

    def flush(self, ns: tuple[str, str] | None = None) -> None:
        """Send the DML gathered for `ns`, or for every namespace, to the writer."""
        for key in [ns] if ns is not None else list(self.runs):
            ops = self.runs.pop(key, None)
            if ops:
                coll = self.client[key[0]][key[1]]
                self.writer.submit(functools.partial(coll.bulk_write, ops, ordered=True))

    def end_unit(self) -> None:
        """Send the transaction gathered, after everything gathered before it."""
        if self.unit:
            self.flush()
            self.writer.submit(functools.partial(_write_unit, self.client, self.unit))
        self.unit, self.unit_key = [], None


PENDING_WRITES = 2  # bulk writes sent to the writer and not yet answered: bounds a task's memory


class _Writer:
    """Runs writes one at a time, in the order submitted, on a thread of its own: the task goes
    on reading and converting events while the target applies the previous bulk write (pymongo
    leaves the GIL while it waits for a reply). At most PENDING_WRITES are outstanding; a
    submit beyond that waits for the oldest. After a write fails none of the later ones runs,
    and the failure is raised to the task at its next submit or `drain`."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bucketspark-writer")
        self.pending: deque[Future[None]] = deque()
        self.failed = False

    def _run(self, write: Callable[[], Any]) -> None:
        if self.failed:
            return
        try:
            write()
        except BaseException:
            self.failed = True
            raise

    def submit(self, write: Callable[[], Any]) -> None:
        self.pending.append(self.pool.submit(self._run, write))
        while len(self.pending) > PENDING_WRITES:
            self.pending.popleft().result()

    def drain(self) -> None:
        """Wait until every write submitted is applied (or raise the first failure)."""
        while self.pending:
            self.pending.popleft().result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


CROSS_BUCKET = ("rename", "dropDatabase")


def _crosses_buckets(kind: str, bucket_by: str) -> bool:
    """By namespace only rename and dropDatabase span buckets; by documentKey every event
    without a documentKey (every kind but DML) is in every bucket."""
    if bucket_by == "documentKey":
        return kind not in DML and kind != "invalidate"
    return kind in CROSS_BUCKET


_APPLIED_SCHEMA = "bucket INT, applied LONG, barrierToken STRING, barrierEvent BINARY"


def replicate_arrow(target_uri: str, bucket_by: str = "namespace") -> Any:
    """A `mapInArrow` function: apply one bucket's events (columns bucket and event) to the
    target, in order, up to its first cross-bucket event (exclusive).

    Arrow carries the BSON column from the JVM as whole buffers; `foreachPartition` would pickle a
    Row object per event. Each event is decoded once, here, and its kind and token read from it:
    the rows' token and operationType columns would only be copied over from the JVM for that.
    Yields one row: the bucket, how many events the task applied, and the cross-bucket event it
    stopped at (token and BSON), if any.
    """

    def apply(batches: Iterable[Any]) -> Iterable[Any]:
        import pyarrow as pa

        settle_worker_heap()
        bucket: int | None = None
        barrier: tuple[str, bytes] | None = None

        def events() -> Iterable[Mapping[str, Any]]:
            nonlocal bucket, barrier
            for batch in batches:
                columns = batch.to_pydict()
                for b, raw in zip(columns["bucket"], columns["event"], strict=True):
                    if b != bucket and bucket is not None:
                        # the source's contract: a partition is a bucket
                        raise ValueError(f"a partition holds buckets {bucket} and {b}")
                    bucket = b
                    ev = bson.decode(raw, PLAIN)
                    if _crosses_buckets(ev["operationType"], bucket_by):
                        barrier = (ev["_id"]["_data"], raw)
                        return
                    yield ev

        client = client_for(
            target_uri
        )  # a target that stops answering fails the task: see CLIENT_DEFAULTS
        try:
            stats = apply_events(client, events())
        finally:
            client.close()
        yield pa.RecordBatch.from_pydict(
            {
                "bucket": [bucket],
                "applied": [stats.applied + stats.ddl],
                "barrierToken": [barrier[0] if barrier else None],
                "barrierEvent": [barrier[1] if barrier else None],
            },
            schema=pa.schema(
                [
                    ("bucket", pa.int32()),
                    ("applied", pa.int64()),
                    ("barrierToken", pa.string()),
                    ("barrierEvent", pa.binary()),
                ]
            ),
        )

    return apply


_SINK_COLUMNS = ("bucket", "event")


def _apply_segment(
    segment: Any, target_uri: str, bucket_by: str, applied: dict[int, int]
) -> list[Any]:
    """Run one Spark job applying each bucket of `segment` up to its first cross-bucket event;
    count what each bucket applied into `applied`; return the rows of the buckets that stopped
    at such an event."""
    results = segment.mapInArrow(replicate_arrow(target_uri, bucket_by), _APPLIED_SCHEMA).collect()
    for r in results:
        if r["bucket"] is not None:
            applied[r["bucket"]] = applied.get(r["bucket"], 0) + r["applied"]
    return [r for r in results if r["barrierToken"] is not None]


def _apply_first_barrier(target_uri: str, stops: list[Any], applied: dict[int, int]) -> str:
    """Apply the earliest of the barriers the buckets stopped at, once; returns its token."""
    first = min(r["barrierToken"] for r in stops)
    at_first = [r for r in stops if r["barrierToken"] == first]
    for r in at_first:  # the barrier is each of these buckets' event
        applied[r["bucket"]] += 1
    client = client_for(target_uri)
    try:
        apply_events(client, [bytes(at_first[0]["barrierEvent"])])
    finally:
        client.close()
    return str(first)


def _resume_after(stops: list[Any], first: str) -> Any:
    """The rows still to apply: buckets that stopped at the applied barrier go on after it;
    those stopped at a later one start at it again (and stop there at once); the others are
    done."""
    from pyspark.sql.functions import col, lit

    resume = lit(False)
    for r in stops:
        after = (
            col("token") > first
            if r["barrierToken"] == first
            else col("token") >= r["barrierToken"]
        )
        resume = resume | ((col("bucket") == r["bucket"]) & after)
    return resume


# What replicate_batch tells of each micro-batch: its epoch id, and the events each bucket applied.
OnBatch = Callable[[int, dict[int, int]], None]


def replicate_batch(
    target_uri: str, on_batch: OnBatch | None = None, *, bucket_by: str = "namespace"
) -> Callable[[Any, int], None]:
    """A `foreachBatch` function: each bucket's partition is applied by its own task, in order.

    `bucket_by` is the source's bucketBy. Events that span buckets (rename, dropDatabase; by
    documentKey every DDL event) are barriers, for the buckets they are in:
    such a bucket's task stops before one, the driver applies the earliest barrier once, and
    the buckets that stopped go on from there in another job. A bucket without barriers runs
    through (its namespaces' order does not depend on them), so the usual batch, with none, is
    one Spark job. `on_batch(epoch_id, applied)` may record per-batch figures: the events each
    bucket applied (from the tasks' results, so recording costs no Spark job of its own).
    """

    def run(df: Any, epoch_id: int) -> None:
        applied: dict[int, int] = {}
        cached = None
        try:
            segment = df.select(*_SINK_COLUMNS)
            while True:
                stops = _apply_segment(segment, target_uri, bucket_by, applied)
                if not stops:
                    break
                first = _apply_first_barrier(target_uri, stops, applied)
                # The usual batch, without barriers, is read once and streams through its
                # tasks uncached; one with barriers is read again for the buckets that go on,
                # from then on from a cache.
                cached = df.persist() if cached is None else cached
                segment = cached.filter(_resume_after(stops, first)).select(*_SINK_COLUMNS)
        finally:
            if cached is not None:
                cached.unpersist()
        if on_batch is not None:
            on_batch(epoch_id, applied)

    return run


def parquet_sink(df: Any, path: str, checkpoint: str) -> Any:
    """The plain sink: events as Parquet files partitioned by namespace."""
    return (
        df.writeStream.format("parquet")
        .partitionBy("db", "coll")
        .option("path", path)
        .option("checkpointLocation", checkpoint)
        .start()
    )
