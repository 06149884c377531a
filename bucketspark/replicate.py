"""`pcs-replicate`: the replication job — a Spark streaming query copying a cluster into another.

    pcs-replicate --proxy mongodb://proxy:27018 --target mongodb://target/ \
        --checkpoint /ckpt --buckets 8

One Spark task per bucket reads through the proxy; `bucketspark.sink.replicate_batch` applies each
micro-batch to the target (ordered bulk writes per namespace, DDL as barriers, idempotent on
replay). All progress lives in the checkpoint: after a crash (even kill -9 of this driver) the
same command resumes from the last committed offsets, and the micro-batch that was in flight is
re-read and re-applied, which leaves the target as if it had been applied once. SIGTERM/SIGINT
stop the query between micro-batches.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from bucketspark._cli import add_version_flag, require_extra


def start_replication(
    spark: Any,
    proxy_uri: str,
    target_uri: str,
    checkpoint: str,
    *,
    buckets: int,
    name: str,
    max_events_per_trigger: int,
    trigger_s: float,
    start: str | None = None,
) -> Any:
    """Start the streaming query; returns the StreamingQuery."""
    from bucketspark.sink import replicate_batch

    reader = (
        spark.readStream.format("parallelchangestream")
        .option("uri", proxy_uri)
        .option("nBuckets", str(buckets))
        .option("name", name)
        .option("maxEventsPerTrigger", str(max_events_per_trigger))
    )
    if start:
        reader = reader.option("startAtOperationTime", start)
    return (
        reader.load()
        .writeStream.foreachBatch(replicate_batch(target_uri))
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{trigger_s} seconds")
        .start()
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="pcs-replicate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_flag(parser)
    parser.add_argument(
        "--proxy", required=True, help="connection string of the parallelChangeStream proxy"
    )
    parser.add_argument(
        "--target", required=True, help="connection string of the target cluster (TLS options ok)"
    )
    parser.add_argument(
        "--checkpoint", required=True, help="Spark checkpoint directory (offsets survive here)"
    )
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--name", default="replicate", help="stream name on the proxy")
    parser.add_argument(
        "--start",
        help='start time for a new checkpoint: "secs,inc", '
        '"Timestamp(secs, inc)" or ISO-8601 (default: now)',
    )
    parser.add_argument("--max-events-per-trigger", type=int, default=100_000)
    parser.add_argument("--trigger-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    require_extra("pcs-replicate", "spark", ["pyspark", "pandas", "pyarrow"])
    from bucketspark.session import spark_session

    spark = spark_session("pcs-replicate")  # the master and settings of Spark's own configuration
    query = start_replication(
        spark,
        args.proxy,
        args.target,
        args.checkpoint,
        buckets=args.buckets,
        name=args.name,
        max_events_per_trigger=args.max_events_per_trigger,
        trigger_s=args.trigger_s,
        start=args.start,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(
        f"replicating {args.proxy} -> {args.target} (checkpoint {args.checkpoint}, Spark master "
        f"{spark.sparkContext.master})",
        flush=True,
    )
    while not stop.wait(0.5) and query.isActive:
        pass
    failure = query.exception()  # None when stopped by a signal
    query.stop()
    spark.stop()
    if failure is not None:
        reason = getattr(failure, "desc", None) or failure
        print(f"pcs-replicate: the replication query failed: {reason}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
