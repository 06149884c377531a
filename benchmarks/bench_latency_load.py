"""Latency under load: write-to-bucket p50/p99 while the application-like mix is written live.

    .venv/bin/python -m benchmarks.bench_latency_load [--backlog 20000] [--seconds 10]

First the proxy's maximum catch-up rate on the application-like mix (benchmarks/workloads.py
`app`) is measured in the same run: a backlog of that mix is written, then read from its start
through `parallelChangeStream` (4 buckets, one consumer per bucket). Then the same mix is
written live, paced at 25%, 50% and 75% of that rate, by a writer in its own process (pymongo
through mongos, bulk writes of what is due every few milliseconds, its transactions as they come),
while a stream opened just before reads it. Each event's latency is the time it reached its
bucket's consumer less its `wallTime` (when the shard applied the write; same machine, same
clock). The writer reports the rate it reached: on a small machine it may fall short of the
rate asked for (`saturated`: below 90% of it), and the figures are then for the rate reached.

Cluster (4 shards), proxy, writer and this process (the consumers) are separate processes.
Writes JSON and a PNG to the output folder (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from datetime import UTC
from typing import Any

import pymongo
import trio

from benchmarks.bench_engine import ProxyProcess, proxy_stream
from benchmarks.common import add_out_option, plot_series, write_json
from benchmarks.workloads import _app_ops, write_workload
from simcluster.launcher import spawn_cluster
from wireproxy.upstream import open_upstream, parse_hosts

LEVELS = (0.25, 0.5, 0.75)
_TICK_S = 0.005  # the writer sends what is due this often
# Writes a bulk write sends at most: applications send small ones, and simcluster stamps one
# wallTime for a whole command, so a large bulk would add its own apply time to every latency.
_CHUNK = 50


def write_paced(
    uri: str, db: str, rate: float, seconds: float, seed: int, ready: Any, go: Any
) -> tuple[int, float]:
    """Write the app mix into `db` at `rate` writes a second for `seconds` (in a process of its
    own); returns (writes, seconds taken). `ready` is set once connected, writing starts on `go`."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri)
    client.admin.command("enableSharding", db)
    ops = _app_ops(seed, 1 << 40)
    sharded: set[str] = set()
    ready.set()
    go.wait()
    done = 0
    start = time.monotonic()
    try:
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(elapsed * rate) + 1 - done
            pending: dict[str, list[Any]] = {}
            while due > 0:
                name, op = next(ops)
                if name == "txn":
                    _flush(client[db], pending)
                    for coll, _ in op:
                        _shard(client, db, coll, sharded)
                    with client.start_session() as session, session.start_transaction():
                        for coll, write in op:
                            client[db][coll].bulk_write([write], session=session)
                    done += len(op)
                    due -= len(op)
                    continue
                _shard(client, db, name, sharded)
                pending.setdefault(name, []).append(op)
                done += 1
                due -= 1
            _flush(client[db], pending)
            time.sleep(_TICK_S)
        return done, time.monotonic() - start
    finally:
        client.close()


def _shard(client: Any, db: str, coll: str, sharded: set[str]) -> None:
    if coll not in sharded:
        client.admin.command("shardCollection", f"{db}.{coll}", key={"_id": "hashed"})
        sharded.add(coll)


def _flush(database: Any, pending: dict[str, list[Any]]) -> None:
    for name, writes in pending.items():
        for at in range(0, len(writes), _CHUNK):
            database[name].bulk_write(writes[at : at + _CHUNK], ordered=True)
    pending.clear()


def _writer_main(
    uri: str, db: str, rate: float, seconds: float, seed: int, ready: Any, go: Any, result: Any
) -> None:
    result.put(write_paced(uri, db, rate, seconds, seed, ready, go))


async def live_latency(
    proxy: ProxyProcess, uri: str, db: str, rate: float, seconds: float, seed: int
) -> dict[str, float]:
    """Write the mix live at `rate` while 4 buckets are read; the latency figures."""
    spawn = multiprocessing.get_context("spawn")
    ready, go, result = spawn.Event(), spawn.Event(), spawn.Queue()
    writer = spawn.Process(
        target=_writer_main, args=(uri, db, rate, seconds, seed, ready, go, result)
    )
    writer.start()
    latencies: list[float] = []
    ctl = await open_upstream("127.0.0.1", proxy.port)
    opened = await ctl.command(
        "admin",
        {"parallelChangeStream": 1, "nBuckets": 4, "name": f"load-{db}-{time.monotonic_ns()}"},
    )
    stop = trio.Event()

    async def consume(cursor_id: Any) -> None:
        conn = await open_upstream("127.0.0.1", proxy.port)
        while not stop.is_set():
            reply = await conn.command(
                "admin",
                {"getMore": cursor_id, "collection": "$cmd.parallelChangeStream", "maxTimeMS": 100},
            )
            now = time.time()
            for event in reply["cursor"]["nextBatch"]:
                wall = event.get("wallTime")
                if wall is not None:
                    latencies.append(now - wall.replace(tzinfo=UTC).timestamp())
        await conn.aclose()

    async with trio.open_nursery() as nursery:
        for cur in opened["cursors"]:
            nursery.start_soon(consume, cur["id"])
        await trio.to_thread.run_sync(ready.wait)
        go.set()
        written, took = await trio.to_thread.run_sync(result.get)
        with trio.move_on_after(20):  # the last writes' events
            while len(latencies) < written:
                await trio.sleep(0.05)
        stop.set()
    await ctl.command(
        "admin",
        {
            "killCursors": "$cmd.parallelChangeStream",
            "cursors": [c["id"] for c in opened["cursors"]],
        },
    )
    await ctl.aclose()
    writer.join()
    ms = sorted(x * 1000 for x in latencies)
    figures: dict[str, float] = {
        "target_rate": rate,
        "achieved_rate": written / took,
        "written": written,
        "events": len(ms),
        "saturated": written / took < 0.9 * rate,
    }
    if ms:

        def pick(q: float) -> float:
            return ms[min(len(ms) - 1, int(q * len(ms)))]

        figures.update(
            p50_ms=pick(0.5),
            p90_ms=pick(0.9),
            p99_ms=pick(0.99),
            max_ms=ms[-1],
            mean_ms=statistics.fmean(ms),
        )
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=20_000,
        help="writes of the backlog the maximum is measured on",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="writing time per load level")
    parser.add_argument("--seed", type=int, default=1)
    add_out_option(parser)
    args = parser.parse_args(argv)
    cluster = spawn_cluster(shards=4, periodic_noop_s=10.0)
    proxy = ProxyProcess(cluster.uri, "--stream-idle-teardown-s", "1")
    results: dict[str, Any] = {}
    try:

        async def run() -> None:
            await proxy.wait_ready()
            host, port = parse_hosts(cluster.uri)[0]
            conn = await open_upstream(host, port)
            start = (await conn.command("admin", {"ping": 1}))["operationTime"]
            await conn.aclose()
            events = await trio.to_thread.run_sync(
                lambda: write_workload(
                    cluster.uri, "app", args.backlog, seed=args.seed, db="backlog"
                )
            )
            began = time.perf_counter()
            got, _ = await proxy_stream(proxy, start, events, 4, 0)
            max_rate = got / (time.perf_counter() - began)
            results["max_catchup_rate"] = max_rate
            results["backlog_events"] = got
            print(f"maximum catch-up rate: {max_rate:,.0f} events/s ({got:,} events)", flush=True)
            await trio.sleep(3)  # the catch-up stream's teardown
            levels: dict[str, Any] = results.setdefault("levels", {})
            for i, level in enumerate(LEVELS):
                name = f"{level:.0%}"
                r = levels[name] = await live_latency(
                    proxy, cluster.uri, f"load{i}", level * max_rate, args.seconds, args.seed + i
                )
                print(
                    f"{name:>4} of max:"
                    f" {r['achieved_rate']:8,.0f}/{r['target_rate']:,.0f} writes/s  "
                    f"{r['events']:>7,}/{r['written']:,} events  p50 {r.get('p50_ms', 0):7.1f} ms  "
                    f"p99 {r.get('p99_ms', 0):7.1f} ms  max {r.get('max_ms', 0):7.1f} ms",
                    flush=True,
                )
                await trio.sleep(3)

        trio.run(run)
    finally:
        proxy.close()
        cluster.close()
    figures = {"seconds": args.seconds, "backlog": args.backlog, "seed": args.seed, **results}
    path = write_json(args.out, "latency_load", figures)
    levels = results.get("levels", {})
    series = {
        q: [
            (100 * float(k.rstrip("%")) / 100, v[f"{q}_ms"])
            for k, v in levels.items()
            if f"{q}_ms" in v
        ]
        for q in ("p50", "p99")
    }
    plot_series(
        args.out,
        "latency_load",
        series,
        xlabel="load (% of the maximum catch-up rate)",
        ylabel="write-to-bucket latency (ms)",
        title="application-like mix written live, 4 shards",
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
