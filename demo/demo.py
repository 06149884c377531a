"""The demo (README command 1): replicate a sharded cluster into another with Spark, then verify.

Starts a 3-shard simcluster as source and another as target, the proxy in front of the source, a
mixed workload (inserts, every update kind, replaces, deletes, multi-shard transactions, DDL, a
chunk migration) with a progress bar, and a Spark streaming job with one task per bucket
replicating through the proxy.
When the target has caught up it compares every collection (count, content hash, indexes),
prints a summary, writes its figures and a PNG of throughput per bucket into `--out` (a folder
under the current directory by default), and exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymongo
from bson import json_util

from bucketspark.session import spark_session
from wireproxy.extras import add_version_flag, require_extra

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from demo.embedded import Environment

# Relative to the current directory: never inside the installed package.
DEFAULT_OUT = "pcs-demo-results"


def _console() -> Console:
    from rich.console import Console  # the [sim] extra: checked by main() before any work

    return Console()


class _Workload:
    """The demo's mixed workload on the source cluster (through the proxy): each step draws one
    kind of write from `rng` and issues a batch of it, returning how many writes it counts."""

    def __init__(self, client: pymongo.MongoClient[Any], rng: random.Random) -> None:
        self.client, self.rng = client, rng
        self.shop, self.crm, self.logs = client.shop, client.crm, client.logs
        self.next_id = self.next_sku = 0
        # A step's share of the draws: below 0.45 inserts, below 0.75 updates, and so on; the
        # rest adds items.
        self._steps: list[tuple[float, Callable[[int], int]]] = [
            (0.45, self.insert),
            (0.75, self.update),
            (0.82, self.delete),
            (0.9, self.transact),
        ]

    def step(self, batch: int) -> int:
        choice = self.rng.random()
        run = next((run for below, run in self._steps if choice < below), self.add_items)
        return run(batch)

    def _some_order(self) -> int:
        return self.rng.randrange(max(self.next_id, 1))

    def insert(self, batch: int) -> int:
        rng = self.rng
        docs = [
            {
                "_id": self.next_id + i,
                "cust": rng.randrange(500),
                "total": rng.randrange(1, 900),
                "lines": [rng.randrange(50) for _ in range(rng.randrange(1, 4))],
            }
            for i in range(batch)
        ]
        self.next_id += batch
        self.shop.orders.insert_many(docs)
        self.logs.events.insert_many(
            [{"k": rng.randrange(10_000), "msg": f"order {d['_id']}"} for d in docs[:50]]
        )
        self.crm.customers.insert_many(
            [{"email": f"c{self.next_id}-{i}@x.io", "visits": 0} for i in range(20)]
        )
        return batch + 70

    def update(self, batch: int) -> int:
        orders = self.shop.orders
        for _ in range(batch // 4):
            oid = self._some_order()
            kind = self.rng.randrange(4)
            if kind == 0:
                orders.update_one({"_id": oid}, {"$inc": {"total": 5}, "$set": {"status": "paid"}})
            elif kind == 1:
                orders.update_one({"_id": oid}, {"$push": {"lines": 7}, "$unset": {"status": ""}})
            elif kind == 2:
                orders.replace_one({"_id": oid}, {"cust": 1, "total": 1, "replaced": True})
            else:
                self.crm.customers.update_many({"visits": {"$lt": 1}}, {"$inc": {"visits": 1}})
        return batch // 4

    def delete(self, batch: int) -> int:
        for _ in range(batch // 8):
            self.shop.orders.delete_one({"_id": self._some_order()})
        return batch // 8

    def transact(self, batch: int) -> int:
        """A transaction across shards (orders is hashed) and collections: pay an order, log it."""
        for _ in range(5):
            oid = self._some_order()

            def pay(s: Any, oid: int = oid) -> None:
                self.shop.orders.update_many(
                    {"_id": {"$in": [oid, oid + 1]}}, {"$set": {"paid": True}}, session=s
                )
                self.crm.payments.insert_one(
                    {"order": oid, "amount": self.rng.randrange(1, 99)}, session=s
                )

            with self.client.start_session() as s:
                s.with_transaction(pay)
        return 10

    def add_items(self, batch: int) -> int:
        self.shop.items.insert_many(
            [{"sku": f"sku-{self.next_sku + i}", "price": i} for i in range(10)]
        )
        self.next_sku += 10
        return 10


def _set_up(client: pymongo.MongoClient[Any]) -> None:
    """Sharded collections and indexes the workload writes to."""
    admin = client.admin
    admin.command("enableSharding", "shop")
    admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
    admin.command("shardCollection", "logs.events", key={"k": 1})
    client.shop.create_collection("items")
    client.shop.items.create_index("sku", unique=True)
    client.crm.customers.create_index([("email", 1)])


def _ddl_and_migration(client: pymongo.MongoClient[Any]) -> None:
    """DDL and a chunk migration at the end of the run (fromMigrate writes never reach
    consumers)."""
    shop, crm, admin = client.shop, client.crm, client.admin
    shop.items.create_index([("price", -1)], name="price_desc")
    shop.command({"collMod": "items", "validationLevel": "moderate"})
    shop.items.drop_index("price_desc")
    crm.create_collection("audit")
    crm.audit.insert_one({"at": "end"})
    crm.create_collection("scratch")
    crm.scratch.insert_one({"tmp": 1})
    crm.drop_collection("scratch")
    target_shard = sorted(s["_id"] for s in admin.command("listShards")["shards"])[-1]
    admin.command("moveChunk", "logs.events", find={"k": 0}, to=target_shard)


def run_workload(client: pymongo.MongoClient[Any], ops: int, seed: int = 7) -> int:
    """A mixed workload through the proxy; returns the number of write operations issued."""
    from rich.progress import Progress

    workload = _Workload(client, random.Random(seed))
    _set_up(client)
    done = 0
    with Progress(console=_console(), transient=False) as progress:
        task = progress.add_task("workload", total=ops)
        while done < ops:
            done += workload.step(min(200, ops - done))
            progress.update(task, completed=min(done, ops))
        _ddl_and_migration(client)
    return done


def content_hash(coll: Any) -> tuple[int, str]:
    docs = sorted(json_util.dumps(d, sort_keys=True) for d in coll.find())
    return len(docs), hashlib.sha256("\n".join(docs).encode()).hexdigest()[:16]


def user_collections(
    client: pymongo.MongoClient[Any], dbs: tuple[str, ...] | None = None
) -> list[tuple[str, str]]:
    out = []
    for db in client.list_database_names():
        if db in ("admin", "config", "local") or (dbs is not None and db not in dbs):
            continue
        for coll in client[db].list_collection_names():
            if not coll.startswith("system."):
                out.append((db, coll))
    return sorted(out)


def verify(
    source: pymongo.MongoClient[Any],
    target: pymongo.MongoClient[Any],
    dbs: tuple[str, ...] | None = None,
) -> list[tuple[str, Any, Any, bool]]:
    """Per collection: (name, (source count+hash, indexes), (target ...), equal?)."""
    rows = []
    in_source, in_target = user_collections(source, dbs), user_collections(target, dbs)
    for db, coll in sorted(set(in_source) | set(in_target)):
        s, t = content_hash(source[db][coll]), content_hash(target[db][coll])
        si = (
            sorted(ix["name"] for ix in source[db][coll].list_indexes())
            if (db, coll) in in_source
            else []
        )
        ti = (
            sorted(ix["name"] for ix in target[db][coll].list_indexes())
            if (db, coll) in in_target
            else []
        )
        rows.append((f"{db}.{coll}", (s, si), (t, ti), s == t and si == ti))
    return rows


def converged(
    source: pymongo.MongoClient[Any],
    target: pymongo.MongoClient[Any],
    dbs: tuple[str, ...] | None = None,
) -> bool:
    return all(ok for *_, ok in verify(source, target, dbs))


def run_demo(ops: int, buckets: int, timeout_s: float, out: Path) -> int:
    from demo.embedded import embedded_environment

    out.mkdir(parents=True, exist_ok=True)
    with embedded_environment(shards=3) as env:
        return _demo(env, ops, buckets, timeout_s, out)


def _demo(env: Environment, ops: int, buckets: int, timeout_s: float, out: Path) -> int:
    from bucketspark.sink import replicate_batch

    console = _console()

    assert env.target is not None
    console.print(
        f"[bold]source[/] {env.source.uri}  [bold]target[/] {env.target.uri}  "
        f"[bold]proxy[/] {env.proxy_uri}"
    )
    spark = spark_session()
    per_batch: list[dict[str, Any]] = []

    def record(epoch_id: int, counts: dict[int, int]) -> None:
        per_batch.append({"t": time.time(), "epoch": epoch_id, "counts": counts})

    checkpoint = tempfile.mkdtemp(prefix="pcs-demo-ckpt-")
    stream_df = (
        spark.readStream.format("parallelchangestream")
        .option("uri", env.proxy_uri)
        .option("nBuckets", str(buckets))
        .option("name", "demo")
        .load()
    )
    query = (
        stream_df.writeStream.foreachBatch(replicate_batch(env.target.uri, record))
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    source: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(env.proxy_uri)
    target: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(env.target.uri)
    started = time.time()
    try:
        while not query.lastProgress and time.time() - started < 60:
            # The first micro-batch opens the stream; writes before it would be missed.
            time.sleep(0.2)
        issued = run_workload(source, ops)
        written = time.time()
        console.print(
            f"workload: {issued} writes in {written - started:.1f}s; "
            "waiting for the target to catch up"
        )
        deadline = time.time() + timeout_s
        while time.time() < deadline and not converged(source, target):
            time.sleep(1)
        lag = time.time() - written
    finally:
        query.stop()
        spark.stop()
    rows = verify(source, target)
    ok = all(r[3] for r in rows)
    _report(rows, per_batch, buckets, lag, ok, out)
    return 0 if ok else 1


def _report(
    rows: list[tuple[str, Any, Any, bool]],
    per_batch: list[dict[str, Any]],
    buckets: int,
    lag: float,
    ok: bool,
    out: Path,
) -> None:
    console = _console()
    console.print(_collections_table(rows))
    totals = {b: sum(p["counts"].get(b, 0) for p in per_batch) for b in range(buckets)}
    console.print(_buckets_table(totals, per_batch))
    console.print(
        f"micro-batches: {len(per_batch)}; catch-up lag after the last write: {lag:.1f}s; "
        f"verification: {'[green]PASSED' if ok else '[red]FAILED'}"
    )
    (out / "demo.json").write_text(
        json.dumps(
            {"buckets": totals, "lag_s": lag, "ok": ok, "batches": per_batch}, default=str, indent=1
        )
    )
    try:
        _plot(per_batch, buckets, out / "demo_throughput.png")
        console.print(f"plot: {out / 'demo_throughput.png'}")
    except ImportError:
        console.print("matplotlib is not installed: no plot")


def _collections_table(rows: list[tuple[str, Any, Any, bool]]) -> Table:
    """Each collection's count, hash and indexes on the source, beside the target's count."""
    from rich.table import Table

    table = Table(title="source vs target")
    for col in ("collection", "source docs", "target docs", "hash", "indexes", "match"):
        table.add_column(col)
    for name, (s, si), (t, _ti), good in rows:
        table.add_row(
            name, str(s[0]), str(t[0]), s[1], ",".join(si), "[green]yes" if good else "[red]NO"
        )
    return table


def _buckets_table(totals: dict[int, int], per_batch: list[dict[str, Any]]) -> Table:
    """Events per bucket, and their rate over the span of the micro-batches."""
    from rich.table import Table

    span = (per_batch[-1]["t"] - per_batch[0]["t"]) if len(per_batch) > 1 else 1.0
    table = Table(title="events per bucket")
    table.add_column("bucket")
    table.add_column("events")
    table.add_column("events/s")
    for b, n in totals.items():
        table.add_row(str(b), str(n), f"{n / max(span, 1e-9):.0f}")
    return table


def _plot(per_batch: list[dict[str, Any]], buckets: int, path: Path) -> None:
    """Events per micro-batch of each bucket over time, as a PNG; ImportError without
    matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    t0 = per_batch[0]["t"] if per_batch else 0
    for b in range(buckets):
        ax.plot(
            [p["t"] - t0 for p in per_batch],
            [p["counts"].get(b, 0) for p in per_batch],
            marker="o",
            label=f"bucket {b}",
        )
    ax.set_xlabel("seconds since the first micro-batch")
    ax.set_ylabel("events per micro-batch")
    ax.set_title("parallelChangeStream demo: throughput per bucket")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="pcs-demo", description=__doc__)
    add_version_flag(parser)
    parser.add_argument("--ops", type=int, default=20_000, help="write operations in the workload")
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument(
        "--timeout", type=float, default=180, help="seconds to wait for the target to catch up"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(DEFAULT_OUT),
        help=f"folder for demo.json and the plot (default: ./{DEFAULT_OUT})",
    )
    args = parser.parse_args(argv)
    require_extra("pcs-demo", "sim,spark", ["rich", "pyspark", "pandas"])
    sys.exit(run_demo(args.ops, args.buckets, args.timeout, args.out))


if __name__ == "__main__":
    main()
