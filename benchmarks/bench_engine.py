"""Catch-up of an N-event backlog over 4 shards: proxy (4 bucket consumers) vs raw oplog reads vs
simcluster's native mongos change stream, side by side in one run.

    .venv/bin/python -m benchmarks.bench_engine [--events 1000000] [--buckets 4]

The cluster runs in its own process (its own core); the proxy, its engine and the consumers run
in this process, whose CPU time gives "events per proxy CPU-second". Goals (issue 5): proxy/raw >=
0.7, proxy/native >= 3, >= 80k events per proxy CPU-second.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio
from bson import Timestamp

from benchmarks.common import write_results
from simcluster.launcher import spawn_cluster
from wireproxy.app import serve_proxy, tune_gc_for_throughput
from wireproxy.config import ProxyConfig
from wireproxy.upstream import open_upstream, parse_hosts


def _ts(key: int) -> Timestamp:
    return Timestamp(key >> 32, key & 0xFFFFFFFF)


async def raw_read(shard_uris: list[str], start: Timestamp) -> int:
    """Every shard's oplog from `start`, read with find/getMore and no processing at all."""
    total = 0

    async def one(uri: str) -> None:
        nonlocal total
        host, port = parse_hosts(uri)[0]
        conn = await open_upstream(host, port)
        reply = await conn.command("local", {"find": "oplog.rs", "filter": {"ts": {"$gte": start}}})
        cursor = reply["cursor"]
        total += len(cursor["firstBatch"])
        while cursor["id"]:
            reply = await conn.command("local", {"getMore": cursor["id"], "collection": "oplog.rs"})
            cursor = reply["cursor"]
            total += len(cursor["nextBatch"])
        await conn.aclose()

    async with trio.open_nursery() as nursery:
        for uri in shard_uris:
            nursery.start_soon(one, uri)
    return total


async def native_stream(mongos_uri: str, start: Timestamp, want: int) -> int:
    host, port = parse_hosts(mongos_uri)[0]
    conn = await open_upstream(host, port)
    reply = await conn.command("admin", {"aggregate": 1, "pipeline": [
        {"$changeStream": {"allChangesForCluster": True, "startAtOperationTime": start}}], "cursor": {}})
    cursor = reply["cursor"]
    got = len(cursor["firstBatch"])
    while got < want:
        reply = await conn.command("admin", {"getMore": cursor["id"], "collection": "$cmd.aggregate",
                                             "maxTimeMS": 1000})
        cursor = reply["cursor"]
        got += len(cursor["nextBatch"])
    await conn.aclose()
    return got


async def proxy_stream(mongos_uri: str, start: Timestamp, want: int, buckets: int) -> tuple[int, dict[str, Any]]:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_proxy, ProxyConfig(upstream=mongos_uri, listen_port=0))
        ctl = await open_upstream("127.0.0.1", server.port)
        opened = await ctl.command("admin", {"parallelChangeStream": 1, "nBuckets": buckets, "name": "bench",
                                             "startAtOperationTime": start})
        total = 0
        done = trio.Event()

        async def consume(cursor_id: Any) -> None:
            nonlocal total
            conn = await open_upstream("127.0.0.1", server.port)
            try:
                while not done.is_set():
                    # Raw bytes all the way: the consumer counts events without decoding them.
                    more = {"getMore": cursor_id, "collection": "$cmd.parallelChangeStream", "maxTimeMS": 200}
                    reply = await conn.command("admin", more, check=False)
                    total += len(reply["cursor"]["nextBatch"])
                    if total >= want:
                        done.set()
            finally:
                await conn.aclose()

        # Session-less cursors belong to the user, so each consumer drains its bucket on its own connection.
        async with trio.open_nursery() as consumers:
            for cur in opened["cursors"]:
                consumers.start_soon(consume, cur["id"])
        status = await ctl.command("admin", {"parallelChangeStreamStatus": 1, "name": "bench"})
        await ctl.aclose()
        nursery.cancel_scope.cancel()
    return total, {"noops": sum(s["noops"] for s in status["streams"][0]["shards"])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=4)
    args = parser.parse_args(argv)
    print(f"prefilling {args.events:,} events over 4 shards in a cluster subprocess ...", flush=True)
    tune_gc_for_throughput()  # what the `wireproxy` entry point does
    cluster = spawn_cluster(shards=4, prefill_events=args.events)
    try:
        start = _ts(min(cluster.info["start"]))
        shard_uris = list(cluster.info["shards"].values())
        results: dict[str, dict[str, float]] = {}

        async def run() -> None:
            for name, fn in (("raw", lambda: raw_read(shard_uris, start)),
                             ("native", lambda: native_stream(cluster.uri, start, args.events)),
                             ("proxy", lambda: proxy_stream(cluster.uri, start, args.events, args.buckets))):
                wall, cpu = time.perf_counter(), time.process_time()
                out = await fn()
                count = out[0] if isinstance(out, tuple) else out
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                results[name] = {"events": count, "seconds": wall, "events_per_s": count / wall,
                                 "cpu_seconds_this_process": cpu}
                print(f"{name:7} {count:>10,} in {wall:6.1f}s  {count / wall:>10,.0f}/s", flush=True)

        trio.run(run)
    finally:
        cluster.close()
    proxy, raw, native = results["proxy"], results["raw"], results["native"]
    figures = {
        "events": args.events, "buckets": args.buckets, "modes": results,
        "proxy_over_raw": proxy["events_per_s"] / raw["events_per_s"],
        "proxy_over_native": proxy["events_per_s"] / native["events_per_s"],
        "proxy_events_per_cpu_second": proxy["events"] / max(proxy["cpu_seconds_this_process"], 1e-9),
        "reader_processes": "not implemented yet: readers run in the proxy process",
    }
    print(f"proxy/raw    {figures['proxy_over_raw']:.2f}   (goal >= 0.7)")
    print(f"proxy/native {figures['proxy_over_native']:.2f}   (goal >= 3)")
    print(f"proxy events per CPU-second {figures['proxy_events_per_cpu_second']:,.0f}   (goal >= 80,000)")
    path = write_results("engine_catchup", figures, {k: v["events_per_s"] for k, v in results.items()},
                         ylabel="events/s", title=f"catch-up of {args.events:,} events over 4 shards")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
