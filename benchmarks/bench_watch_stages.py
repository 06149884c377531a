"""An unchanged consumer's watch() with stages: mongos vs the accelerating proxy, side by side.

    .venv/bin/python -m benchmarks.bench_watch_stages [--events 200000]

A cluster-wide watch() with fullDocument: updateLookup reads an N-insert backlog over 4 shards,
with no stages, with Debezium's default pipeline (its namespace $concat'ed beside the event, a
$match by regex, the event made the root again), and with that pipeline after its oversize
"skip" mode's $expr/$bsonSize $match. Stages beyond a $match decode, evaluate and re-encode every
event, in simcluster's mongos as in the proxy; the proxy spreads that work over its
readerProcesses (buckets/shaping.py), whose processes a short warm-up starts. Each mode runs once,
the proxies' readerProcesses values in turn; the figures are events/s and the ratio to mongos
for the same pipeline.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from benchmarks.bench_engine import ProxyProcess, _ts, watch_stream
from benchmarks.common import add_out_option, write_results
from simcluster.launcher import spawn_cluster

# Debezium's pipelines (ChangeStreamPipelineFactory), for the benchmark's databases bench0..3.
DEBEZIUM: list[dict[str, Any]] = [
    {
        "$replaceRoot": {
            "newRoot": {"namespace": {"$concat": ["$ns.db", ".", "$ns.coll"]}, "event": "$$ROOT"}
        }
    },
    {
        "$match": {
            "$and": [
                {"namespace": {"$regex": "bench\\d\\..*", "$options": "i"}},
                {"event.operationType": {"$in": ["insert", "update", "replace", "delete"]}},
            ]
        }
    },
    {"$replaceRoot": {"newRoot": "$event"}},
]
SKIP: list[dict[str, Any]] = [
    {
        "$match": {
            "$and": [
                {"$expr": {"$lte": [{"$bsonSize": f"${field}"}, 16 << 20]}}
                for field in ("fullDocument", "fullDocumentBeforeChange")
            ]
        }
    }
]
PIPELINES: dict[str, list[dict[str, Any]]] = {
    "no stages": [],
    "debezium": DEBEZIUM,
    "debezium skip mode": SKIP + DEBEZIUM,
}


async def watch(uri: str, start: Any, pipeline: list[dict[str, Any]], want: int) -> int:
    return await watch_stream(uri, start, want, pipeline, fullDocument="updateLookup")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--reader-processes", type=int, nargs="*", default=[0, 2])
    add_out_option(parser)
    args = parser.parse_args(argv)
    print(
        f"prefilling {args.events:,} events over 4 shards in a cluster subprocess ...", flush=True
    )
    cluster = spawn_cluster(shards=4, prefill_events=args.events, periodic_noop_s=0.5)
    proxies = {
        rp: ProxyProcess(cluster.uri, "--accelerate-change-streams", "--reader-processes", str(rp))
        for rp in args.reader_processes
    }
    rates: dict[str, dict[str, float]] = {}
    try:
        start = _ts(min(cluster.info["start"]))

        async def run() -> None:
            for proxy in proxies.values():
                await proxy.wait_ready()
                # Its reader and shaping processes started (interpreters, imports) before it is
                # timed.
                await watch(proxy.uri, start, DEBEZIUM, 5000)
            for name, pipeline in PIPELINES.items():
                targets = [
                    ("mongos", cluster.uri),
                    *((f"proxy rp={rp}", p.uri) for rp, p in proxies.items()),
                ]
                for where, uri in targets:
                    wall = time.perf_counter()
                    count = await watch(uri, start, pipeline, args.events)
                    rate = count / (time.perf_counter() - wall)
                    rates.setdefault(name, {})[where] = rate
                    ratio = rate / rates[name]["mongos"]
                    print(
                        f"{name:20} {where:12} {rate:>10,.0f}/s  {ratio:4.2f}x mongos", flush=True
                    )
                    await trio.sleep(2)  # the stream's teardown is not charged to the next one

        trio.run(run)
    finally:
        for proxy in proxies.values():
            proxy.close()
        cluster.close()
    figures = {
        "events": args.events,
        "events_per_s": rates,
        "over_mongos": {
            name: {where: rate / by["mongos"] for where, rate in by.items()}
            for name, by in rates.items()
        },
    }
    bars = {f"{name}: {where}": rate for name, by in rates.items() for where, rate in by.items()}
    path = write_results(
        args.out,
        "watch_stages",
        figures,
        bars,
        ylabel="events/s",
        title=f"watch() with updateLookup and stages, {args.events:,} events over 4 shards",
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
