"""simcluster must never be what limits the proxy's benchmarks: raw oplog batches served to one
reader (goal >= 300k entries/s) and pymongo insert_many (goal >= 100k docs/s), side by side.

insert_many is measured with one client (each batch encoded, sent and acknowledged in turn, so
the client's own encoding counts) and with several client processes at once (what the simulator
itself sustains, the figure the goal is about).

    .venv/bin/python -m benchmarks.bench_simcluster [--entries 300000] [--docs 100000] [--clients 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from typing import Any

import pymongo
import trio

from benchmarks.bench_engine import _ts, raw_read
from benchmarks.common import add_out_option, write_results
from simcluster.launcher import spawn_cluster


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=300_000)
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument(
        "--clients", type=int, default=2, help="client processes for the concurrent insert run"
    )
    add_out_option(parser)
    args = parser.parse_args(argv)
    cluster = spawn_cluster(shards=1, prefill_events=args.entries)
    try:
        start = _ts(min(cluster.info["start"]))
        t = time.perf_counter()
        n = trio.run(raw_read, list(cluster.info["shards"].values()), start, None)
        read_rate = n / (time.perf_counter() - t)
        insert_rate = _insert_many(cluster.uri, "one", args.docs)
        concurrent_rate = _concurrent_inserts(cluster.uri, args.docs, args.clients)
    finally:
        cluster.close()
    print(f"raw oplog serving  {read_rate:>10,.0f} entries/s  (goal >= 300,000)")
    print(f"insert_many        {insert_rate:>10,.0f} docs/s     (one client)")
    print(
        f"insert_many        {concurrent_rate:>10,.0f} docs/s"
        f"     ({args.clients} client processes; goal >= 100,000)"
    )
    write_results(
        args.out,
        "simcluster",
        {
            "oplog_entries_per_s": read_rate,
            "insert_many_docs_per_s": concurrent_rate,
            "insert_many_one_client_docs_per_s": insert_rate,
            "clients": args.clients,
            "entries": args.entries,
            "docs": args.docs,
        },
        {
            "oplog entries/s": read_rate,
            "insert_many docs/s (1 client)": insert_rate,
            f"insert_many docs/s ({args.clients} clients)": concurrent_rate,
        },
        ylabel="per second",
        title="simcluster serving rates (one process, one core)",
    )


def _insert_many(uri: str, coll: str, docs: int, start: Any = None) -> float:
    """Insert `docs` documents in batches of 1000 with one client; returns docs/s."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri)
    try:
        batch = [{"i": i, "pad": "x" * 50} for i in range(1000)]
        client.admin.command("ping")  # connected before the clock starts
        if start is not None:
            start.wait()
        t = time.perf_counter()
        for _ in range(docs // 1000):
            client.bench[coll].insert_many([dict(d) for d in batch], ordered=False)
        return docs / (time.perf_counter() - t)
    finally:
        client.close()


def _concurrent_inserts(uri: str, docs: int, clients: int) -> float:
    """`clients` processes inserting at once, each its share into its own collection."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Manager().Barrier(clients + 1)  # every client connected, then all go at once
    with ctx.Pool(clients) as pool:
        jobs = [
            pool.apply_async(_insert_many, (uri, f"c{k}", docs // clients, start))
            for k in range(clients)
        ]
        start.wait()
        t = time.perf_counter()
        for job in jobs:
            job.get()
        return docs // clients * clients / (time.perf_counter() - t)


if __name__ == "__main__":
    main()
