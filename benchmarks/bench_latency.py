"""Live-tail latency, write to event: simcluster's native mongos change stream vs the proxy's
buckets.

    .venv/bin/python -m benchmarks.bench_latency [--rate 500] [--seconds 10]

A writer inserts documents stamped with their wall time at a steady rate; a consumer reports,
for each event, how long after its write it arrived. Two workloads, each streamed natively
(`watch()` on mongos, the whole cluster) and through the proxy (`parallelChangeStream`, 4
buckets, one consumer per bucket; readerProcesses 0 and 1), one after the other on the same
cluster:
- spread: a hashed-sharded collection, so every shard writes all the time;
- one hot shard: an unsharded collection, which lives on one shard while the other three idle.
  A stream may return an event only once every shard has promised nothing earlier can come,
  which an idle shard does with its periodic noop: every 10 s on a server (and here). The proxy
  writes its own noop when a shard holds events back.
Cluster, proxy and this process (writer and consumers) are separate processes. Writes JSON and a
PNG to benchmarks/results/.

With --baseline-tree DIR (a checkout of another commit, `git worktree add DIR COMMIT`), that
tree's proxy is measured too, as "baseline", taking turns with this one. --modes and
--workloads pick what runs (default: all).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import bson
import trio

from benchmarks.bench_engine import ProxyProcess
from benchmarks.common import add_out_option, write_results
from simcluster.launcher import spawn_cluster
from wireproxy.upstream import UpstreamConnection, open_upstream, parse_hosts

WORKLOADS = {"spread": ("lat", "spread"), "one hot shard": ("lat", "hot")}


async def write_steadily(
    conn: UpstreamConnection, db: str, coll: str, rate: int, seconds: float
) -> int:
    """Insert `rate` documents a second for `seconds`, each stamped with its write time."""
    n = 0
    start = trio.current_time()
    while (elapsed := trio.current_time() - start) < seconds:
        due = int(elapsed * rate) + 1
        docs = [{"_id": bson.ObjectId(), "t": time.time()} for _ in range(due - n)]
        if docs:
            await conn.command(db, {"insert": coll, "documents": docs})
            n = due
        await trio.sleep(0.005)
    return n


def _latencies(batch: Any, now: float, out: list[float]) -> None:
    for raw in batch:
        doc = raw.get("fullDocument") if hasattr(raw, "get") else None
        if doc is not None and "t" in doc:
            out.append(now - doc["t"])


async def native_consumer(
    uri: str,
    out: list[float],
    stop: trio.Event,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    host, port = parse_hosts(uri)[0]
    conn = await open_upstream(host, port)
    whole_cluster = [{"$changeStream": {"allChangesForCluster": True}}]
    reply = await conn.command("admin", {"aggregate": 1, "pipeline": whole_cluster, "cursor": {}})
    cursor_id = reply["cursor"]["id"]
    task_status.started()
    while not stop.is_set():
        reply = await conn.command(
            "admin", {"getMore": cursor_id, "collection": "$cmd.aggregate", "maxTimeMS": 100}
        )
        _latencies(reply["cursor"]["nextBatch"], time.time(), out)
    await conn.aclose()


async def proxy_consumers(
    proxy: ProxyProcess,
    out: list[float],
    stop: trio.Event,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    *,
    reader_processes: int = 0,
) -> None:
    ctl = await open_upstream("127.0.0.1", proxy.port)
    opened = await ctl.command(
        "admin", {"parallelChangeStream": 1, "nBuckets": 4, "readerProcesses": reader_processes}
    )

    async def consume(cursor_id: Any) -> None:
        conn = await open_upstream("127.0.0.1", proxy.port)
        while not stop.is_set():
            reply = await conn.command(
                "admin",
                {"getMore": cursor_id, "collection": "$cmd.parallelChangeStream", "maxTimeMS": 100},
            )
            _latencies(reply["cursor"]["nextBatch"], time.time(), out)
        await conn.aclose()

    async with trio.open_nursery() as nursery:
        for cur in opened["cursors"]:
            nursery.start_soon(consume, cur["id"])
        task_status.started()
    await ctl.command(
        "admin",
        {
            "killCursors": "$cmd.parallelChangeStream",
            "cursors": [c["id"] for c in opened["cursors"]],
        },
    )
    await ctl.aclose()


def summary(latencies: list[float], written: int) -> dict[str, float]:
    ms = sorted(x * 1000 for x in latencies)
    if not ms:
        return {"events": 0, "written": written}
    pick = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    return {
        "events": len(ms),
        "written": written,
        "p50_ms": pick(0.5),
        "p90_ms": pick(0.9),
        "p99_ms": pick(0.99),
        "max_ms": ms[-1],
        "mean_ms": statistics.fmean(ms),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=500, help="inserts per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="writing time per measurement")
    parser.add_argument(
        "--baseline-tree",
        default=None,
        help="another checkout whose proxy is measured too, as 'baseline' (and 'baseline rp1')",
    )
    parser.add_argument(
        "--modes",
        default=None,
        help="comma-separated: native, proxy, proxy rp1, baseline, baseline rp1 (default: all)",
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated: spread, one hot shard"
    )
    add_out_option(parser)
    args = parser.parse_args(argv)
    cluster = spawn_cluster(shards=4, periodic_noop_s=10.0)
    # Streams are closed a second after their consumers leave (not the default 5 minutes): each
    # kept reading its shards (and writing notes) beside the measurements that followed.
    proxy = ProxyProcess(cluster.uri, "--stream-idle-teardown-s", "1")
    baseline = (
        ProxyProcess(cluster.uri, "--stream-idle-teardown-s", "1", tree=args.baseline_tree)
        if args.baseline_tree
        else None
    )
    results: dict[str, dict[str, float]] = {}
    try:

        async def run() -> None:
            await proxy.wait_ready()
            if baseline is not None:
                await baseline.wait_ready()
            host, port = parse_hosts(cluster.uri)[0]
            writer = await open_upstream(host, port)
            await writer.command("admin", {"enableSharding": "lat"})
            await writer.command(
                "admin", {"shardCollection": "lat.spread", "key": {"_id": "hashed"}}
            )
            await writer.command("lat", {"create": "hot"})
            consumers: dict[str, Callable[..., Awaitable[None]]] = {
                "native": lambda out, stop, task_status: native_consumer(
                    cluster.uri, out, stop, task_status
                ),
                "proxy": lambda out, stop, task_status: proxy_consumers(
                    proxy, out, stop, task_status
                ),
                # The shards read in a reader process: nudges and notes cross the process boundary.
                "proxy rp1": lambda out, stop, task_status: proxy_consumers(
                    proxy, out, stop, task_status, reader_processes=1
                ),
            }
            if baseline is not None:
                consumers["baseline"] = lambda out, stop, task_status: proxy_consumers(
                    baseline, out, stop, task_status
                )
                consumers["baseline rp1"] = lambda out, stop, task_status: proxy_consumers(
                    baseline, out, stop, task_status, reader_processes=1
                )
            if args.modes is not None:
                consumers = {m: consumers[m] for m in args.modes.split(",")}

            async def measure(
                mode: str, db: str, coll: str, seconds: float
            ) -> tuple[list[float], int]:
                out: list[float] = []
                stop = trio.Event()
                async with trio.open_nursery() as nursery:
                    await nursery.start(consumers[mode], out, stop)
                    written = await write_steadily(writer, db, coll, args.rate, seconds)
                    # The last writes may wait for the idle shards' periodic noops (every 10 s).
                    with trio.move_on_after(25):
                        while len(out) < written:
                            await trio.sleep(0.05)
                    stop.set()
                if mode != "native":
                    await trio.sleep(3)  # the stream's teardown, before the next measurement
                return out, written

            # Native first: a proxy stream keeps reading (and writing notes) after its cursors
            # close, until its idle teardown, which would move a native stream's idle shards too.
            # Proxy and baseline take turns, per workload, so that both meet the same noise.
            for workload in args.workloads.split(","):
                db, coll = WORKLOADS[workload]
                for mode in consumers:
                    out, written = await measure(mode, db, coll, args.seconds)
                    name = f"{workload}, {mode}"
                    results[name] = summary(out, written)
                    r = results[name]
                    print(
                        f"{name:26} {r['events']:>6,}/{written:,} events"
                        f"  p50 {r.get('p50_ms', 0):8.1f} ms  "
                        f"p99 {r.get('p99_ms', 0):8.1f} ms  max {r.get('max_ms', 0):8.1f} ms",
                        flush=True,
                    )
            await writer.aclose()

        trio.run(run)
    finally:
        proxy.close()
        if baseline is not None:
            baseline.close()
        cluster.close()
    path = write_results(
        args.out,
        "latency",
        {"rate": args.rate, "seconds": args.seconds, "results": results},
        {k: v.get("p50_ms", 0.0) for k, v in results.items()},
        ylabel="p50 write-to-event latency (ms)",
        title=f"live tail at {args.rate} inserts/s, 4 shards",
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
