"""pymongo throughput directly against simcluster's mongos and through the proxy, in one run:
(a) small insert_one, (b) find over 100k documents in batches. Goal: through/direct >= 0.7 for (b).

    .venv/bin/python -m benchmarks.bench_proxy [--inserts 5000] [--docs 100000]

The cluster and the proxy each run in their own process; the client is this process.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

import pymongo

from benchmarks.common import add_out_option, write_results
from simcluster.launcher import spawn_cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _measure(uri: str, inserts: int, docs: int, coll: str) -> dict[str, float]:
    client: pymongo.MongoClient[dict] = pymongo.MongoClient(uri)
    c = client.bench[coll]
    t = time.perf_counter()
    for i in range(inserts):
        c.insert_one({"i": i})
    insert_rate = inserts / (time.perf_counter() - t)
    t = time.perf_counter()
    n = sum(1 for _ in client.bench.big.find({}, batch_size=1000))
    find_rate = n / (time.perf_counter() - t)
    client.close()
    return {"insert_one_per_s": insert_rate, "find_docs_per_s": find_rate, "found": n}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--inserts", type=int, default=5000)
    parser.add_argument("--docs", type=int, default=100_000)
    add_out_option(parser)
    args = parser.parse_args(argv)
    cluster = spawn_cluster(shards=2)
    port = _free_port()
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wireproxy",
            "--upstream",
            cluster.uri,
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        setup: pymongo.MongoClient[dict] = pymongo.MongoClient(cluster.uri)
        for k in range(0, args.docs, 5000):
            setup.bench.big.insert_many([{"k": k + i, "pad": "y" * 64} for i in range(5000)])
        setup.close()
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        direct = _measure(cluster.uri, args.inserts, args.docs, "direct")
        through = _measure(f"mongodb://127.0.0.1:{port}/", args.inserts, args.docs, "proxied")
    finally:
        proxy.terminate()
        proxy.wait(10)
        cluster.close()
    ratios = {
        "insert_one": through["insert_one_per_s"] / direct["insert_one_per_s"],
        "find_batched": through["find_docs_per_s"] / direct["find_docs_per_s"],
    }
    print(
        f"insert_one   direct {direct['insert_one_per_s']:>9,.0f}/s"
        f"  proxy {through['insert_one_per_s']:>9,.0f}/s"
        f"  ratio {ratios['insert_one']:.2f}"
    )
    print(
        f"find batched direct {direct['find_docs_per_s']:>9,.0f}/s"
        f"  proxy {through['find_docs_per_s']:>9,.0f}/s"
        f"  ratio {ratios['find_batched']:.2f}  (goal >= 0.7)"
    )
    write_results(
        args.out,
        "proxy_passthrough",
        {"direct": direct, "proxy": through, "ratios": ratios},
        {
            "insert_one direct": direct["insert_one_per_s"],
            "insert_one proxy": through["insert_one_per_s"],
            "find/100 direct": direct["find_docs_per_s"] / 100,
            "find/100 proxy": through["find_docs_per_s"] / 100,
        },
        ylabel="ops/s (find: docs/s / 100)",
        title="pymongo directly vs through wireproxy",
    )


if __name__ == "__main__":
    main()
