"""Soak: the proxy's memory and one stream's completeness while other streams come and go.

    .venv/bin/python -m benchmarks.bench_soak [--seconds 90] [--reader-processes 0 1]

For each readerProcesses value, a fresh 3-shard cluster and proxy (its own processes), and:
- a writer inserting 200-document batches into a hashed-sharded collection, a range-sharded one
  with 1 MB chunks (the balancer moves ranges all along) and eight unsharded ones;
- one long-lived named stream with 4 buckets, each drained by its own consumer connection;
- churn, one client every 0.2 s: a stream opened with 1, 4 or 16 buckets (default budgets or
  small ones) and read a little, an accelerated `watch()`, a getMore hung up on mid-wait, a
  named stream reopened with another bucket count, a status call, a getMore on an unknown
  cursor. Each client leaves without killing its cursors: the proxy's cursor timeout (10 s here)
  and stream teardown (5 s) reap them. The proxy's memory limit (6 GiB here) refuses streams
  whose budgets no longer fit beside the others' (ExceededMemoryLimit; a watch() is then served
  by mongos).

With `--stepdown-every S`, each shard is a 3-member replica set and every S seconds the primary
of a random shard is stepped down (forced), so the readers switch members and writes are retried
(w: majority; an acknowledged insert must never go missing, a rolled-back one never show up).

Reports the proxy's resident memory (main and reader processes) over time, and whether the
long-lived stream saw every insert once. Memory must level off: what churn leaves behind is freed
by the timeouts, so the second half's peak should stay near the first half's. Writes JSON and a
PNG to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from typing import Any

import bson
import psutil
import trio
from bson.raw_bson import RawBSONDocument

from benchmarks.bench_engine import ProxyProcess
from benchmarks.common import add_out_option, plot_series, write_json
from mongoformats.errors import MongoError, has_category
from simcluster.launcher import spawn_cluster
from wireproxy.upstream import UpstreamClosed, UpstreamConnection, open_upstream, parse_hosts

NS = "$cmd.parallelChangeStream"
SAMPLE_S = 5.0
MIB = 1 << 20
# The proxy's --memory-limit-bytes: the long-lived stream reserves 1 GiB of it (3 shards x 256 MiB,
# 4 buckets x 64 MiB), the churn's abandoned streams the rest, until opens are refused.
MEMORY_LIMIT = 6 << 30


def resident_mib(proxy: ProxyProcess) -> tuple[float, float]:
    """Resident MiB of the proxy's main process, and of its reader processes together."""
    children = 0
    for child in proxy.ps.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a reader process may just be stopping
            children += child.memory_info().rss
    return proxy.ps.memory_info().rss / 2**20, children / 2**20


class Soak:
    def __init__(self, proxy: ProxyProcess, reader_processes: int) -> None:
        self.proxy = proxy
        self.rp = reader_processes
        self.writing = True
        self.running = True
        self.written: set[bytes] = set()
        self.written_all = trio.Event()
        self.seen: set[bytes] = set()
        self.duplicates = 0
        self.churned: dict[str, int] = {}
        self.stepdowns = 0
        self.samples: list[tuple[float, float]] = []  # (seconds, MiB)
        self.engine_status: dict[str, Any] = {}  # the proxy's memory and watch() figures at the end

    async def connect(self) -> UpstreamConnection:
        return await open_upstream("127.0.0.1", self.proxy.port)

    async def write(self) -> None:
        conn = await self.connect()
        await conn.command("admin", {"enableSharding": "soak"})
        await conn.command("admin", {"shardCollection": "soak.h", "key": {"_id": "hashed"}})
        # Range-sharded on an ever-growing key, with 1 MB chunks: every insert lands on the last
        # chunk's shard, so the balancer keeps moving ranges off it (migrations, and with
        # --stepdown-every, migrations cut short by failovers).
        await conn.command("admin", {"shardCollection": "soak.r", "key": {"_id": 1}})
        await conn.command("admin", {"configureCollectionBalancing": "soak.r", "chunkSize": 1})
        while self.writing:
            for coll in ("h", "r", f"u{random.randrange(8)}"):
                ids = [bson.ObjectId() for _ in range(200)]
                conn = await self.insert(conn, coll, ids)
                self.written.update(i.binary for i in ids)
            await conn.command(
                "soak",
                {"update": "h", "updates": [{"q": {}, "u": {"$inc": {"n": 1}}}]},
                check=False,
            )
            await trio.sleep(0.05)
        await conn.aclose()
        self.written_all.set()

    async def insert(
        self, conn: UpstreamConnection, coll: str, ids: list[bson.ObjectId]
    ) -> UpstreamConnection:
        """Insert documents with these ids, majority-acknowledged, retrying through failovers.
        Unordered, so a retry inserts what the failed attempt did not (duplicate keys are what it
        did). soak.r's documents are larger, so that its 1 MB chunks fill in seconds."""
        pad = "x" * (2000 if coll == "r" else 200)
        cmd = {
            "insert": coll,
            "ordered": False,
            "writeConcern": {"w": "majority"},
            "documents": [{"_id": i, "pad": pad} for i in ids],
        }
        for _ in range(100):
            try:
                reply = await conn.command("soak", cmd)
                if not reply.get("writeConcernError") and all(
                    e["code"] == 11000 for e in reply.get("writeErrors", [])
                ):
                    return conn
            except UpstreamClosed:
                conn = await self.connect()
            except MongoError as exc:
                if not has_category(exc.code, "RetriableError"):
                    raise
            await trio.sleep(0.3)
        raise RuntimeError(f"insert into soak.{coll} failed 100 times")

    async def consume_steadily(self) -> None:
        ctl = await self.connect()
        opened = await ctl.command(
            "admin",
            {
                "parallelChangeStream": 1,
                "nBuckets": 4,
                "name": "steady",
                "readerProcesses": self.rp,
                "shardBufferBytes": 256 * MIB,
            },
        )

        async def bucket(cursor_id: Any) -> None:
            conn = await self.connect()
            while self.running:
                reply = await conn.command(
                    "admin", {"getMore": cursor_id, "collection": NS, "maxTimeMS": 200}
                )
                for event in reply["cursor"]["nextBatch"]:
                    if event["operationType"] == "insert":
                        key = event["documentKey"]["_id"].binary
                        if key in self.seen:
                            self.duplicates += 1
                        self.seen.add(key)

        async with trio.open_nursery() as nursery:
            for cursor in opened["cursors"]:
                nursery.start_soon(bucket, cursor["id"])

    async def open_stream(self, conn: UpstreamConnection, **options: Any) -> RawBSONDocument | None:
        """A parallelChangeStream's reply, or None if the proxy's memory limit refused it
        (ExceededMemoryLimit); other errors are in the reply."""
        opened = await conn.command(
            "admin", {"parallelChangeStream": 1, "readerProcesses": self.rp, **options}, check=False
        )
        return None if opened.get("code") == 146 else opened

    async def churn_once(self, conn: UpstreamConnection) -> str:
        kind = random.choice(["stream", "watch", "hang up", "rebucket", "status", "unknown cursor"])
        if kind == "stream":
            # Half with the default budgets, which seldom fit beside the others under the memory
            # limit.
            budgets = random.choice(
                [{}, {"shardBufferBytes": 64 * MIB, "bucketBufferBytes": 8 * MIB}]
            )
            opened = await self.open_stream(conn, nBuckets=random.choice([1, 4, 16]), **budgets)
            if opened is None:
                return "stream refused"
            for cursor in opened["cursors"][:2]:
                await conn.command(
                    "admin", {"getMore": cursor["id"], "collection": NS, "maxTimeMS": 50}
                )
        elif kind == "watch":
            watch = await conn.command(
                "soak", {"aggregate": "h", "pipeline": [{"$changeStream": {}}], "cursor": {}}
            )
            await conn.command(
                "soak", {"getMore": watch["cursor"]["id"], "collection": "h", "maxTimeMS": 50}
            )
        elif kind == "hang up":  # the connection closes while its getMore waits for events
            opened = await self.open_stream(conn, nBuckets=2, shardBufferBytes=64 * MIB)
            if opened is None:
                return "hang up refused"
            with trio.move_on_after(0.05):
                await conn.command(
                    "admin",
                    {"getMore": opened["cursors"][0]["id"], "collection": NS, "maxTimeMS": 5000},
                )
        elif kind == "rebucket":
            opened = await self.open_stream(
                conn, nBuckets=random.choice([2, 3]), name=f"re{random.randrange(3)}"
            )
            if opened is None:
                return "rebucket refused"
            if opened.get("ok"):
                await conn.command(
                    "admin", {"killCursors": NS, "cursors": [c["id"] for c in opened["cursors"]]}
                )
        elif kind == "status":
            await conn.command("admin", {"parallelChangeStreamStatus": 1})
        else:
            await conn.command(
                "admin", {"getMore": bson.Int64(12345), "collection": NS}, check=False
            )
        return kind

    async def churn(self) -> None:
        while self.running:
            conn = await self.connect()
            kind = await self.churn_once(conn)
            self.churned[kind] = self.churned.get(kind, 0) + 1
            await conn.aclose()  # its cursors are left to the timeouts
            await trio.sleep(0.2)

    async def sample(self, started: float) -> None:
        while self.running:
            elapsed = time.monotonic() - started
            main, readers = resident_mib(self.proxy)
            self.samples.append((elapsed, main + readers))
            balancer = ""
            with contextlib.suppress(
                UpstreamClosed, MongoError
            ):  # mongos may be waiting out an election
                conn = await self.connect()
                rounds = (await conn.command("admin", {"balancerStatus": 1}))["numBalancerRounds"]
                moves = (
                    await conn.command(
                        "config", {"count": "changelog", "query": {"what": "moveChunk.from"}}
                    )
                )["n"]
                compliant = (
                    await conn.command("admin", {"balancerCollectionStatus": "soak.r"}, check=False)
                ).get("balancerCompliant")
                await conn.aclose()
                balancer = f"balancer rounds {rounds}, {moves} moves, compliant {compliant}  "
            print(
                f"  rp={self.rp} {elapsed:5.0f}s  proxy {main:7.1f} + {readers:6.1f} MiB"
                f"  {balancer}"
                f"{len(self.written):>9,} inserts written, {len(self.seen):>9,} read"
                f"  churn {self.churned}",
                flush=True,
            )
            await trio.sleep(SAMPLE_S)

    async def run(self, seconds: float, shards: dict[str, str], stepdown_every_s: float) -> None:
        await self.proxy.wait_ready()
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            if stepdown_every_s:
                nursery.start_soon(self.step_down_primaries, shards, stepdown_every_s)
            nursery.start_soon(self.write)
            nursery.start_soon(self.consume_steadily)
            nursery.start_soon(self.churn)
            nursery.start_soon(self.sample, started)
            await trio.sleep(seconds)
            self.writing = False
            with trio.move_on_after(
                30
            ):  # the last write ends, and the long-lived stream catches up with it
                await self.written_all.wait()
                while not self.written <= self.seen:
                    await trio.sleep(0.2)
            self.running = False
            conn = await self.connect()
            status = bson.decode(
                (await conn.command("admin", {"parallelChangeStreamStatus": 1})).raw
            )
            moves = {
                note: (
                    await conn.command(
                        "config",
                        {
                            "count": "changelog",
                            "query": {"what": "moveChunk.from", "details.note": note},
                        },
                    )
                )["n"]
                for note in ("success", "aborted")
            }
            self.engine_status = {
                "memory": status["memory"],
                "watches": status["watches"],
                "migrations": moves,
            }
            nursery.cancel_scope.cancel()

    async def step_down_primaries(self, shards: dict[str, str], every_s: float) -> None:
        """Every `every_s`, step down (forced) whichever member of a random shard is primary: one
        member, the first found (going on through the list stepped down the member just elected
        too, which left the shard without a primary for seconds)."""
        while True:
            await trio.sleep(every_s)
            for host, port in parse_hosts(random.choice(list(shards.values()))):
                if await self.step_down_if_primary(host, port):
                    self.stepdowns += 1
                    break

    @staticmethod
    async def step_down_if_primary(host: str, port: int) -> bool:
        with contextlib.suppress(UpstreamClosed, MongoError):
            member = await open_upstream(host, port)
            try:
                if (await member.command("admin", {"hello": 1})).get("isWritablePrimary"):
                    await member.command(
                        "admin",
                        {"replSetStepDown": 5, "secondaryCatchUpPeriodSecs": 2, "force": True},
                        check=False,
                    )
                    return True
            finally:
                await member.aclose()
        return False

    def figures(self, seconds: float) -> dict[str, Any]:
        first = max(m for t, m in self.samples if t <= seconds / 2)
        second = max(m for t, m in self.samples if t > seconds / 2)
        return {
            "seconds": seconds,
            "inserts_written": len(self.written),
            "inserts_read": len(self.seen),
            "inserts_lost": len(self.written - self.seen),
            "inserts_duplicated": self.duplicates,
            "churn": self.churned,
            "stepdowns": self.stepdowns,
            "proxy_status_at_end": self.engine_status,
            "proxy_mib_first_half_peak": first,
            "proxy_mib_second_half_peak": second,
            "second_over_first_half_peak": second / first,
            "samples": self.samples,
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--reader-processes", type=int, nargs="*", default=[0, 1])
    parser.add_argument(
        "--stepdown-every",
        type=float,
        default=0.0,
        metavar="S",
        help="3-member shards, a random shard's primary stepped down every S seconds (0: off)",
    )
    add_out_option(parser)
    args = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    for rp in args.reader_processes:
        if args.stepdown_every:
            cluster = spawn_cluster(
                shards=3,
                periodic_noop_s=1,
                members=3,
                flags=["--election-timeout-s", "0.5", "--replication-lag-s", "0.01"],
            )
        else:
            cluster = spawn_cluster(shards=3, periodic_noop_s=1)
        proxy = ProxyProcess(
            cluster.uri,
            "--accelerate-change-streams",
            "--reader-processes",
            str(rp),
            "--stream-idle-teardown-s",
            "5",
            "--cursor-timeout-s",
            "10",
            "--memory-limit-bytes",
            str(MEMORY_LIMIT),
        )
        try:
            soak = Soak(proxy, rp)
            trio.run(soak.run, args.seconds, cluster.info["shards"], args.stepdown_every)
        finally:
            proxy.close()
            cluster.close()
        results[f"rp={rp}"] = figures = soak.figures(args.seconds)
        print(
            f"rp={rp}: {figures['inserts_read']:,} of {figures['inserts_written']:,} inserts read "
            f"({figures['inserts_lost']} lost, {figures['inserts_duplicated']} twice; "
            f"{figures['stepdowns']} stepdowns); proxy peak "
            f"{figures['proxy_mib_first_half_peak']:.0f} MiB in the first half, "
            f"{figures['proxy_mib_second_half_peak']:.0f} MiB in the second "
            f"({figures['second_over_first_half_peak']:.2f}x)"
        )
    name = "soak_stepdowns" if args.stepdown_every else "soak"
    path = write_json(args.out, name, {"stepdown_every_s": args.stepdown_every, "modes": results})
    plot_series(
        args.out,
        name,
        {mode: r["samples"] for mode, r in results.items()},
        xlabel="seconds",
        ylabel="proxy resident MiB (main + reader processes)",
        title=f"proxy memory under stream churn, {args.seconds:.0f} s"
        + (f", a stepdown every {args.stepdown_every:g} s" if args.stepdown_every else ""),
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
