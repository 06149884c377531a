"""simcluster must never be what limits the proxy's benchmarks: raw oplog batches served to one
reader (goal >= 300k entries/s) and pymongo insert_many (goal >= 100k docs/s), side by side.

    .venv/bin/python -m benchmarks.bench_simcluster [--entries 300000] [--docs 100000]
"""

from __future__ import annotations

import argparse
import time

import pymongo
import trio

from benchmarks.bench_engine import _ts, raw_read
from benchmarks.common import write_results
from simcluster.launcher import spawn_cluster


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=300_000)
    parser.add_argument("--docs", type=int, default=100_000)
    args = parser.parse_args(argv)
    cluster = spawn_cluster(shards=1, prefill_events=args.entries)
    try:
        start = _ts(min(cluster.info["start"]))
        t = time.perf_counter()
        n = trio.run(raw_read, list(cluster.info["shards"].values()), start)
        read_rate = n / (time.perf_counter() - t)
        client: pymongo.MongoClient[dict] = pymongo.MongoClient(cluster.uri)
        docs = [{"i": i, "pad": "x" * 50} for i in range(args.docs)]
        t = time.perf_counter()
        for k in range(0, len(docs), 1000):
            client.bench.ins.insert_many(docs[k : k + 1000], ordered=False)
        insert_rate = args.docs / (time.perf_counter() - t)
        client.close()
    finally:
        cluster.close()
    print(f"raw oplog serving  {read_rate:>10,.0f} entries/s  (goal >= 300,000)")
    print(f"insert_many        {insert_rate:>10,.0f} docs/s     (goal >= 100,000)")
    write_results("simcluster", {"oplog_entries_per_s": read_rate, "insert_many_docs_per_s": insert_rate,
                                 "entries": args.entries, "docs": args.docs},
                  {"oplog entries/s": read_rate, "insert_many docs/s": insert_rate},
                  ylabel="per second", title="simcluster serving rates (one process, one core)")


if __name__ == "__main__":
    main()
