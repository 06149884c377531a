"""Replicating a backlog into a target cluster: Spark on parallel buckets vs per-event
transactions, and vs the target's own bulk-write rate.

    python -m benchmarks.bench_replication --events 1000000 --baseline-events 20000

Every pipeline replays the same backlog (N inserts over 8 sharded namespaces, prefilled on a
4-shard simcluster) into a fresh target simcluster, in the same run:
- baseline: the replay of shared/reference/004 — one native `watch()` on mongos with
  fullDocument updateLookup and batchSize 2000, and one transaction per event on the target
  (withTransaction around a single insert/replace/delete). Its rate does not depend on N, so it
  runs on the first `--baseline-events` events to keep the run short;
- ours: `spark.readStream.format("parallelchangestream")` through the proxy with 4 buckets (one
  Spark task each, local[2]) and `replicate_batch` (ordered bulk writes per namespace run), timed
  from query start until the target holds all N documents;
- ceiling: the sink's physical limit, the target's own rate for the writes the sink makes: the
  same N upserting replaceOnes (`dml_ops` of each insert event), read from the source beforehand,
  sent by one pymongo client as ordered bulk writes of `FLUSH_OPS` per namespace in the order
  the sink flushes them (the backlog's order), timed from the first write to the last reply.
Source, target and proxy each run in their own process. Prints the ratios spark/per-event
(goal >= 5x) and spark/ceiling (goal >= 0.7), both from query start, and spark/ceiling after
Spark's start-up (after the first micro-batch that applied events), and writes
replication.json (with each micro-batch's events and end time) and .png. The JSON also holds the
CPU seconds each process group used (source cluster, target cluster, proxy, Spark's JVM, the
pyspark workers, the driver), for the ceiling and for Spark in all and per micro-batch, and
Spark's per-trigger durations: with the cores shared, the rate follows the CPU each event costs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import shutil
import tempfile
import time
from typing import Any

import psutil
import pymongo
import trio
from bson import Timestamp
from bson.raw_bson import RawBSONDocument

from benchmarks.bench_engine import ProxyProcess, _ts
from benchmarks.common import add_out_option, write_results
from bucketspark.sink import FLUSH_OPS, dml_ops
from simcluster.launcher import spawn_cluster

NAMESPACES = [f"bench{i % 4}.c{i}" for i in range(8)]  # what simcluster.launcher.prefill writes


def target_count(target: pymongo.MongoClient[Any]) -> int:
    return sum(
        target[ns.split(".")[0]][ns.split(".")[1]].estimated_document_count() for ns in NAMESPACES
    )


def clear(target: pymongo.MongoClient[Any]) -> None:
    for db in {ns.split(".")[0] for ns in NAMESPACES}:
        target.drop_database(db)


def _write_one(coll: Any, ops: list[Any], session: Any) -> Any:
    return coll.bulk_write(ops, session=session)


def per_event_transactions(
    source_uri: str, target_uri: str, start: Timestamp, events: int
) -> dict[str, Any]:
    """The reference replay: native change stream, one target transaction per event."""
    source: pymongo.MongoClient[Any] = pymongo.MongoClient(source_uri)
    target: pymongo.MongoClient[Any] = pymongo.MongoClient(target_uri)
    done = 0
    began = time.perf_counter()
    with source.watch(
        start_at_operation_time=start, full_document="updateLookup", batch_size=2000
    ) as stream:
        for change in stream:
            if change["operationType"] not in ("insert", "update", "replace", "delete"):
                continue
            coll = target[change["ns"]["db"]][change["ns"]["coll"]]
            ops = dml_ops(change)
            with target.start_session() as session:
                session.with_transaction(functools.partial(_write_one, coll, ops))
            done += 1
            if done >= events:
                break
    elapsed = time.perf_counter() - began
    source.close()
    target.close()
    return {"events": done, "seconds": elapsed, "events_per_s": done / elapsed}


def backlog_writes(source_uri: str) -> list[tuple[tuple[str, str], list[Any]]]:
    """The sink's bulk writes for the prefilled backlog, in the order it sends them: each
    namespace's upserts in the backlog's order (prefill numbers its writes in field `i`), cut
    into runs of FLUSH_OPS, a run sent when its last event has been read."""
    source: pymongo.MongoClient[RawBSONDocument] = pymongo.MongoClient(
        source_uri, document_class=RawBSONDocument
    )
    ordered: list[tuple[int, tuple[str, str], Any]] = []
    for ns in NAMESPACES:
        db, coll = ns.split(".")
        for doc in source[db][coll].find():
            event = {
                "operationType": "insert",
                "documentKey": {"_id": doc["_id"]},
                "fullDocument": doc,
            }
            ordered += [(doc["i"], (db, coll), op) for op in dml_ops(event)]
    source.close()
    ordered.sort(key=lambda w: w[0])
    runs: dict[tuple[str, str], list[Any]] = {}
    writes: list[tuple[tuple[str, str], list[Any]]] = []
    for _, target_ns, op in ordered:
        run = runs.setdefault(target_ns, [])
        run.append(op)
        if len(run) >= FLUSH_OPS:
            writes.append((target_ns, runs.pop(target_ns)))
    writes += list(runs.items())
    return writes


def bulk_write_ceiling(
    target_uri: str, writes: list[tuple[tuple[str, str], list[Any]]], meter: CpuMeter
) -> dict[str, Any]:
    """The target's rate for `writes` as ordered bulk writes from one client."""
    target: pymongo.MongoClient[Any] = pymongo.MongoClient(target_uri)
    target.admin.command("ping")  # connected before the clock starts
    cpu_start = meter.read()
    began = time.perf_counter()
    for (db, coll), ops in writes:
        target[db][coll].bulk_write(ops, ordered=True)
    elapsed = time.perf_counter() - began
    cpu = _cpu_delta(meter.read(), cpu_start)
    done = sum(len(ops) for _, ops in writes)
    target.close()
    return {
        "cpu_s": {k: v for k, v in cpu.items() if k in ("target", "driver")},
        "events": done,
        "seconds": elapsed,
        "events_per_s": done / elapsed,
        "bulk_writes": len(writes),
        "batch_ops": FLUSH_OPS,
    }


def _tree_cpu(ps: psutil.Process) -> float:
    """User + system CPU seconds of `ps` and its descendants, those that exited and were waited
    for included (a pyspark worker the daemon reaped counts in the daemon's children times)."""
    total = 0.0
    for p in [ps, *ps.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuMeter:
    """CPU seconds by process group, read at each micro-batch's end: the source cluster, the
    target cluster, the proxy, Spark's JVM and the pyspark workers (the JVM's Python children)
    and this driver process (its own threads, without its children)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.fixed = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.me = psutil.Process()

    def _jvm(self) -> psutil.Process | None:
        for child in self.me.children():
            with contextlib.suppress(psutil.Error):
                if "java" in child.name():
                    return child
        return None

    def read(self) -> dict[str, float]:
        cpu = {name: _tree_cpu(ps) for name, ps in self.fixed.items()}
        jvm = self._jvm()
        workers = _tree_cpu(jvm) if jvm is not None else 0.0
        own = sum(jvm.cpu_times()[:2]) if jvm is not None else 0.0
        cpu["spark_jvm"] = own
        cpu["pyspark_workers"] = workers - own
        cpu["driver"] = sum(self.me.cpu_times()[:2])
        return cpu


def _cpu_delta(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 2) for k, v in now.items()}


def spark_buckets(
    proxy_uri: str,
    target_uri: str,
    start: Timestamp,
    events: int,
    buckets: int,
    timeout_s: float,
    meter: CpuMeter,
) -> dict[str, Any]:
    from bucketspark.session import spark_session
    from bucketspark.sink import replicate_batch

    spark = spark_session("pcs-bench-replication")
    target: pymongo.MongoClient[Any] = pymongo.MongoClient(target_uri)
    checkpoint = tempfile.mkdtemp(prefix="pcs-bench-ckpt-")
    batches: list[tuple[int, int, float]] = []  # epoch, events applied, seconds since start
    cpu: list[dict[str, float]] = []  # CPU seconds by process group at each batch's end
    durations: list[dict[str, int]] = []

    def on_batch(epoch: int, counts: dict[int, int]) -> None:
        batches.append((epoch, sum(counts.values()), time.perf_counter() - began))
        cpu.append(meter.read())

    try:
        cpu_start = meter.read()
        began = time.perf_counter()
        df = (
            spark.readStream.format("parallelchangestream")
            .option("uri", proxy_uri)
            .option("nBuckets", str(buckets))
            .option("name", "bench-replication")
            .option("startAtOperationTime", f"{start.time},{start.inc}")
            .option("showExpandedEvents", "false")
            .option("maxEventsPerTrigger", "200000")
            .load()
        )
        query = (
            df.writeStream.foreachBatch(replicate_batch(target_uri, on_batch))
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="0 seconds")
            .start()
        )
        # Done when the micro-batches have applied every event (a batch is reported once its
        # tasks' writes are acknowledged), not by counting the target's documents while it runs:
        # simcluster's count walks every document, a cost that grows with the target and would
        # be taken from the cores the replication runs on. The target is counted once, at the end.
        deadline = time.monotonic() + timeout_s
        while _applied(batches) < events and time.monotonic() < deadline:
            time.sleep(0.1)
        elapsed = batches[-1][2] if _applied(batches) >= events else time.perf_counter() - began
        copied = target_count(target)
        # Where each trigger's time went, as Spark tells it (addBatch: the sink's jobs;
        # latestOffset: planning with the proxy; queryPlanning, walCommit...).
        durations = [p["durationMs"] for p in query.recentProgress]
        query.stop()
    finally:
        spark.stop()
        target.close()
        shutil.rmtree(checkpoint, ignore_errors=True)
    return {
        "events": copied,
        "seconds": elapsed,
        "events_per_s": copied / elapsed,
        "micro_batches": len(batches),
        "batches": [
            {"epoch": e, "events": n, "ended_s": t, "cpu_s": _cpu_delta(c, prev)}
            for (e, n, t), c, prev in zip(batches, cpu, [cpu_start, *cpu], strict=False)
        ],
        "cpu_s": _cpu_delta(cpu[-1], cpu_start) if cpu else {},
        "trigger_ms": durations,
        **_after_start(batches, copied, elapsed),
    }


def _applied(batches: list[tuple[int, int, float]]) -> int:
    return sum(n for _, n, _ in batches)


def _after_start(
    batches: list[tuple[int, int, float]], copied: int, elapsed: float
) -> dict[str, Any]:
    """The rate once the query runs: the events after the first micro-batch over the time after
    it. Spark pays its start-up (its Python workers, the plan's code generation) in the first
    micro-batch, whatever it holds (the source waits briefly for the proxy's first events, so
    it usually holds a few thousand); and in any micro-batches that applied nothing before the
    first that did."""
    first = next((i for i, (_, n, _) in enumerate(batches) if n), None)
    if first is None or first + 1 >= len(batches):
        return {}
    startup = batches[first][2]
    later = copied - sum(n for _, n, _ in batches[: first + 1])
    return {"startup_s": startup, "after_startup_events_per_s": later / (elapsed - startup)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--baseline-events", type=int, default=20_000)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--timeout-s", type=float, default=3600)
    add_out_option(parser)
    args = parser.parse_args(argv)

    source = spawn_cluster(shards=4, prefill_events=args.events)
    target = spawn_cluster(shards=4)
    proxy = ProxyProcess(source.uri)
    try:
        trio.run(proxy.wait_ready)
        start = _ts(min(source.info["start"]))
        client: pymongo.MongoClient[Any] = pymongo.MongoClient(target.uri)
        print(
            f"backlog: {args.events:,} inserts on 4 shards; "
            f"baseline on the first {args.baseline_events:,}"
        )
        baseline = per_event_transactions(
            source.uri, target.uri, start, min(args.baseline_events, args.events)
        )
        print(
            f"per-event transactions   {baseline['events_per_s']:>10,.0f} events/s "
            f"({baseline['events']:,} in {baseline['seconds']:.1f}s)"
        )
        clear(client)
        meter = CpuMeter(
            {"source": source.process.pid, "target": target.process.pid, "proxy": proxy.ps.pid}
        )
        ceiling = bulk_write_ceiling(target.uri, backlog_writes(source.uri), meter)
        print(
            f"ceiling: ordered bulk    {ceiling['events_per_s']:>10,.0f} events/s "
            f"({ceiling['events']:,} in {ceiling['seconds']:.1f}s, "
            f"{ceiling['bulk_writes']} bulk writes of <= {FLUSH_OPS}); CPU s {ceiling['cpu_s']}"
        )
        clear(client)
        ours = spark_buckets(
            f"mongodb://127.0.0.1:{proxy.port}/",
            target.uri,
            start,
            args.events,
            args.buckets,
            args.timeout_s,
            meter,
        )
        print(
            f"spark, {args.buckets} buckets          {ours['events_per_s']:>10,.0f} events/s "
            f"({ours['events']:,} in {ours['seconds']:.1f}s, {ours['micro_batches']} micro-batches)"
        )
        print(f"  CPU s by process: {ours['cpu_s']}")
        for d in ours["trigger_ms"]:
            print(f"  trigger ms: {d}")
        for b in ours["batches"]:
            print(f"  batch {b['epoch']}: {b['events']:,} by {b['ended_s']:.1f}s {b['cpu_s']}")
        if "after_startup_events_per_s" in ours:
            print(
                f"  after its start-up     {ours['after_startup_events_per_s']:>10,.0f} "
                f"events/s (after the first micro-batch with events, at {ours['startup_s']:.1f}s)"
            )
        client.close()
    finally:
        proxy.close()
        source.close()
        target.close()
    ratio = ours["events_per_s"] / baseline["events_per_s"]
    of_ceiling = ours["events_per_s"] / ceiling["events_per_s"]
    print(f"ratio spark/per-event-transactions: {ratio:.1f}x (goal >= 5x)")
    print(f"ratio spark/ceiling: {of_ceiling:.2f} (goal >= 0.7)")
    running = ours.get("after_startup_events_per_s")
    of_ceiling_running = running / ceiling["events_per_s"] if running else None
    if of_ceiling_running is not None:
        print(f"ratio spark after its start-up/ceiling: {of_ceiling_running:.2f}")
    write_results(
        args.out,
        "replication",
        {
            "events": args.events,
            "buckets": args.buckets,
            "baseline": baseline,
            "ceiling": ceiling,
            "spark": ours,
            "ratio": ratio,
            "goal": 5.0,
            "ratio_of_ceiling": of_ceiling,
            "goal_of_ceiling": 0.7,
            "ratio_of_ceiling_after_startup": of_ceiling_running,
        },
        {
            "per-event txn": baseline["events_per_s"],
            f"spark {args.buckets} buckets": ours["events_per_s"],
            "ceiling (bulk writes)": ceiling["events_per_s"],
        },
        ylabel="events/s",
        title=f"Replicating {args.events:,} events ({ratio:.1f}x per-event; "
        f"{of_ceiling:.2f} of the ceiling)",
    )


if __name__ == "__main__":
    main()
