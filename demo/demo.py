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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymongo
from bson import json_util

from bucketspark.session import spark_session
from wireproxy.extras import add_version_flag, require_extra

if TYPE_CHECKING:
    from rich.console import Console

    from demo.embedded import Environment

# Relative to the current directory: never inside the installed package.
DEFAULT_OUT = "pcs-demo-results"


def _console() -> Console:
    from rich.console import Console  # the [sim] extra: checked by main() before any work

    return Console()


def run_workload(client: pymongo.MongoClient[Any], ops: int, seed: int = 7) -> int:
    """A mixed workload through the proxy; returns the number of write operations issued."""
    from rich.progress import Progress

    rng = random.Random(seed)
    admin = client.admin
    admin.command("enableSharding", "shop")
    admin.command("shardCollection", "shop.orders", key={"_id": "hashed"})
    admin.command("shardCollection", "logs.events", key={"k": 1})
    shop, crm, logs = client.shop, client.crm, client.logs
    shop.create_collection("items")
    shop.items.create_index("sku", unique=True)
    crm.customers.create_index([("email", 1)])
    done = 0
    with Progress(console=_console(), transient=False) as progress:
        task = progress.add_task("workload", total=ops)
        next_id = next_sku = 0
        while done < ops:
            batch = min(200, ops - done)
            choice = rng.random()
            if choice < 0.45:
                docs = [
                    {
                        "_id": next_id + i,
                        "cust": rng.randrange(500),
                        "total": rng.randrange(1, 900),
                        "lines": [rng.randrange(50) for _ in range(rng.randrange(1, 4))],
                    }
                    for i in range(batch)
                ]
                next_id += batch
                shop.orders.insert_many(docs)
                logs.events.insert_many(
                    [{"k": rng.randrange(10_000), "msg": f"order {d['_id']}"} for d in docs[:50]]
                )
                crm.customers.insert_many(
                    [{"email": f"c{next_id}-{i}@x.io", "visits": 0} for i in range(20)]
                )
                done += batch + 70
            elif choice < 0.75:
                for _ in range(batch // 4):
                    oid = rng.randrange(max(next_id, 1))
                    kind = rng.randrange(4)
                    if kind == 0:
                        shop.orders.update_one(
                            {"_id": oid}, {"$inc": {"total": 5}, "$set": {"status": "paid"}}
                        )
                    elif kind == 1:
                        shop.orders.update_one(
                            {"_id": oid}, {"$push": {"lines": 7}, "$unset": {"status": ""}}
                        )
                    elif kind == 2:
                        shop.orders.replace_one(
                            {"_id": oid}, {"cust": 1, "total": 1, "replaced": True}
                        )
                    else:
                        crm.customers.update_many({"visits": {"$lt": 1}}, {"$inc": {"visits": 1}})
                done += batch // 4
            elif choice < 0.82:
                for _ in range(batch // 8):
                    shop.orders.delete_one({"_id": rng.randrange(max(next_id, 1))})
                done += batch // 8
            elif choice < 0.9:
                # A transaction across shards (orders is hashed) and collections: pay an order, log it.
                for _ in range(5):
                    oid = rng.randrange(max(next_id, 1))

                    def pay(s: Any, oid: int = oid) -> None:
                        shop.orders.update_many(
                            {"_id": {"$in": [oid, oid + 1]}}, {"$set": {"paid": True}}, session=s
                        )
                        crm.payments.insert_one(
                            {"order": oid, "amount": rng.randrange(1, 99)}, session=s
                        )

                    with client.start_session() as s:
                        s.with_transaction(pay)
                done += 10
            else:
                shop.items.insert_many(
                    [{"sku": f"sku-{next_sku + i}", "price": i} for i in range(10)]
                )
                next_sku += 10
                done += 10
            progress.update(task, completed=min(done, ops))
        # DDL and a chunk migration at the end of the run (fromMigrate writes never reach consumers).
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
        f"[bold]source[/] {env.source.uri}  [bold]target[/] {env.target.uri}  [bold]proxy[/] {env.proxy_uri}"
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
            time.sleep(
                0.2
            )  # the first micro-batch opens the stream; writes before it would be missed
        issued = run_workload(source, ops)
        written = time.time()
        console.print(
            f"workload: {issued} writes in {written - started:.1f}s; waiting for the target to catch up"
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
    from rich.table import Table

    console = _console()
    table = Table(title="source vs target")
    for col in ("collection", "source docs", "target docs", "hash", "indexes", "match"):
        table.add_column(col)
    for name, (s, si), (t, _ti), good in rows:
        table.add_row(
            name, str(s[0]), str(t[0]), s[1], ",".join(si), "[green]yes" if good else "[red]NO"
        )
    console.print(table)
    totals = {b: sum(p["counts"].get(b, 0) for p in per_batch) for b in range(buckets)}
    span = (per_batch[-1]["t"] - per_batch[0]["t"]) if len(per_batch) > 1 else 1.0
    bt = Table(title="events per bucket")
    bt.add_column("bucket")
    bt.add_column("events")
    bt.add_column("events/s")
    for b, n in totals.items():
        bt.add_row(str(b), str(n), f"{n / max(span, 1e-9):.0f}")
    console.print(bt)
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
        fig.savefig(out / "demo_throughput.png", dpi=100)
        console.print(f"plot: {out / 'demo_throughput.png'}")
    except ImportError:
        console.print("matplotlib is not installed: no plot")


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
