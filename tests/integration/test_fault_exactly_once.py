"""Fault test: kill -9 of the proxy, stopped and restarted shard members and stepdowns, while
writes go on and 4 bucket consumers resume from their last tokens after each failure. Every
acknowledged write must reach its bucket exactly once, each bucket in token order.

The proxy runs as a subprocess (`python -m wireproxy`), killed with SIGKILL and started again on
the same port. simcluster runs every member in the test's own process, so a member failure is
its in-process facility (ReplicaSet.stop_member drops the member's connections and keeps its data,
as a killed mongod; restart_member brings it back as a catching-up secondary; step_down is
replSetStepDown). Writes go straight to mongos with majority write concern and are retried until
acknowledged (a duplicate key on a retry means an earlier attempt was applied). A consumer is a
pymongo client: it attaches its bucket with `resumeAfter` its last postBatchResumeToken, reads
with getMore, and on any error attaches again from that token, as a change stream driver resumes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bson
import psutil
import pytest
import trio
from bson import Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo.errors import BulkWriteError, PyMongoError

from mongoformats.resume_token import high_water_mark, token_sort_key
from simcluster import SimCluster, open_cluster
from tests.conftest import _close_all, client, free_port, poll_until, sync

pytestmark = pytest.mark.fault

N_BUCKETS = 4
NS = "$cmd.parallelChangeStream"
RAW = bson.CodecOptions(document_class=RawBSONDocument)
BATCH = 10  # inserts per namespace per round
# One hashed-sharded collection per bucket (crc32(ns) % 4): each bucket is read from both shards.
NAMESPACES = {
    b: next(
        f"fault.c{i}" for i in range(100) if zlib.crc32(f"fault.c{i}".encode()) % N_BUCKETS == b
    )
    for b in range(N_BUCKETS)
}
ROOT = Path(__file__).resolve().parents[2]


class Proxy:
    """`python -m wireproxy` on a fixed port, killed with SIGKILL and started again there."""

    def __init__(self, upstream: str, log: Path) -> None:
        self.upstream, self.port, self.log = upstream, free_port(), log
        self.process: subprocess.Popen[bytes] | None = None
        self.kills = 0
        self.children: list[psutil.Process] = []  # its reader processes, at each kill

    async def start(self) -> None:
        with self.log.open("ab") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "wireproxy",
                    "--upstream",
                    self.upstream,
                    "--listen",
                    f"127.0.0.1:{self.port}",
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        with trio.fail_after(60):
            while True:
                assert self.process.poll() is None, f"the proxy exited; see {self.log}"
                try:
                    await (await trio.open_tcp_stream("127.0.0.1", self.port)).aclose()
                    return
                except OSError:
                    await trio.sleep(0.1)

    def kill(self) -> None:
        assert self.process is not None
        self.children += psutil.Process(self.process.pid).children(recursive=True)
        self.process.kill()  # SIGKILL: no shutdown, no goodbye to clients or upstream
        self.process.wait()
        self.kills += 1


@dataclass
class Written:
    """Acknowledged inserts per namespace, in write order; `rounds` counts completed rounds."""

    ids: dict[str, list[int]] = field(
        default_factory=lambda: {ns: [] for ns in NAMESPACES.values()}
    )
    rounds: int = 0
    retries: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


@dataclass
class Consumer:
    bucket: int
    token: dict[str, Any]
    events: list[tuple[bytes, str, str, Any]] = field(default_factory=list)  # key, opType, ns, _id
    resumes: int = 0
    errors: list[str] = field(default_factory=list)
    end: bytes | None = None  # set once the writes are over: read until the resume token passes it


def _write(uri: str, written: Written) -> None:
    """Rounds of BATCH inserts into every namespace until told to stop; each batch is retried until
    acknowledged (majority, the implicit default)."""
    c = client(uri, serverSelectionTimeoutMS=20000)
    while not written.stop.is_set():
        lo = written.rounds * BATCH
        for ns in NAMESPACES.values():
            db, coll = ns.split(".")
            docs = [{"_id": i} for i in range(lo, lo + BATCH)]
            while True:
                try:
                    c[db][coll].insert_many(docs, ordered=False)
                    break
                except BulkWriteError as exc:
                    details = exc.details
                    if not details.get("writeConcernErrors") and all(
                        e["code"] == 11000 for e in details["writeErrors"]
                    ):
                        break  # the rest were applied by an earlier attempt
                except PyMongoError:
                    pass
                written.retries += 1
                time.sleep(0.05)
            written.ids[ns] += [d["_id"] for d in docs]
        written.rounds += 1


def _consume(port: int, con: Consumer, reader_processes: int) -> None:
    """Bucket 0 reads slowest and re-attaches first, bucket 3 fastest and last: after a proxy
    restart the stream is opened for the oldest token, and the newer ones attach while it is
    still catching up to them."""
    pause = (N_BUCKETS - 1 - con.bucket) * 0.04
    c = client(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=2000, socketTimeoutMS=10000)
    while con.end is None or token_sort_key(con.token) < con.end:
        try:
            # An explicit session: the cursor belongs to the session it was opened in.
            with c.start_session() as s:
                reply = c.admin.command(
                    {
                        "parallelChangeStream": 1,
                        "name": "fault",
                        "nBuckets": N_BUCKETS,
                        "bucket": con.bucket,
                        "resumeAfter": con.token,
                        "readerProcesses": reader_processes,
                    },
                    session=s,
                )
                cid = reply["cursor"]["id"]
                while con.end is None or token_sort_key(con.token) < con.end:
                    r = c.admin.command(
                        {"getMore": cid, "collection": NS, "batchSize": BATCH, "maxTimeMS": 200},
                        session=s,
                        codec_options=RAW,
                    )["cursor"]
                    for e in r["nextBatch"]:
                        ns = f"{e['ns']['db']}.{e['ns'].get('coll')}" if "ns" in e else ""
                        doc_id = e["documentKey"]["_id"] if "documentKey" in e else None
                        con.events.append(
                            (bytes.fromhex(e["_id"]["_data"]), e["operationType"], ns, doc_id)
                        )
                    con.token = bson.decode(r["postBatchResumeToken"].raw)
                    if con.end is None:
                        time.sleep(pause)
        except PyMongoError as exc:
            con.resumes += 1
            con.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            assert len(con.errors) < 500, f"bucket {con.bucket} keeps failing: {con.errors[-5:]}"
            time.sleep(0.1 + 0.1 * con.bucket)


async def _rounds(written: Written, more: int) -> None:
    """Until `more` rounds beyond now are acknowledged."""
    target = written.rounds + more
    await poll_until(lambda: written.rounds >= target, 60, interval=0.02)


async def _faults(
    cluster: SimCluster, proxy: Proxy, written: Written, first: str, second: str
) -> None:
    """Three proxy kills, two members stopped and restarted, a failover and a stepdown; the
    writes go on throughout."""
    rs0, rs1 = cluster.replsets[first], cluster.replsets[second]
    await _rounds(written, 3)
    proxy.kill()  # 1. the proxy dies while every consumer reads
    await _rounds(written, 2)
    await proxy.start()
    await _rounds(written, 3)
    secondary = next(m for m in rs0.members if not m.is_primary)
    rs0.stop_member(secondary)  # 2. a secondary the readers may tail
    await _rounds(written, 3)
    await rs0.restart_member(secondary)
    await _rounds(written, 2)
    await rs1.step_down(rs1.primary, 60, 10, False)  # 3. a stepdown
    await _rounds(written, 3)
    proxy.kill()  # 4. the proxy again, then a failover while it is down
    old_primary = rs0.primary
    rs0.stop_member(old_primary)
    await _rounds(written, 3)
    await proxy.start()
    await _rounds(written, 3)
    await rs0.restart_member(old_primary)
    await _rounds(written, 2)
    secondary = next(m for m in rs1.members if not m.is_primary)
    rs1.stop_member(secondary)  # 5. a member and the proxy at once
    proxy.kill()
    await proxy.start()
    await _rounds(written, 3)
    await rs1.restart_member(secondary)
    await _rounds(written, 3)


def _end_point(uri: str) -> bytes:
    """A note on every shard, then the high-water mark just past it."""
    c = client(uri)
    c.admin.command("appendOplogNote", data={"test": "end"})
    ts = c.admin.command("ping")["operationTime"]
    return token_sort_key(high_water_mark(Timestamp(ts.time, ts.inc + 1)))


def _check(con: Consumer, written: Written) -> None:
    keys = [k for k, *_ in con.events]
    assert keys == sorted(set(keys)), (
        f"bucket {con.bucket}: {len(keys) - len(set(keys))} repeated, or reordered"
    )
    ns = NAMESPACES[con.bucket]
    inserts = [doc_id for _, op, in_ns, doc_id in con.events if op == "insert"]
    assert all(in_ns == ns for _, op, in_ns, _ in con.events if op == "insert"), (
        "an event in the wrong bucket"
    )
    assert sorted(inserts) == sorted(set(inserts)), f"bucket {con.bucket}: duplicated inserts"
    lost = set(written.ids[ns]) - set(inserts)
    assert not lost, f"bucket {con.bucket}: {len(lost)} acknowledged inserts lost"
    assert sorted(inserts) == written.ids[ns], f"bucket {con.bucket}: inserts nobody acknowledged"
    rounds = [doc_id // BATCH for doc_id in inserts]
    assert rounds == sorted(rounds), f"bucket {con.bucket}: a later batch before an earlier one"


@pytest.mark.parametrize("reader_processes", [0, 1])
async def test_no_acknowledged_write_lost_or_repeated_across_proxy_kills_and_member_failures(
    tmp_path: Path, reader_processes: int
) -> None:
    """With readerProcesses 1 the shards are read in a process of the proxy's, which must not
    outlive a proxy killed with SIGKILL."""
    # Secondaries trail by 20 ms, so a stopped primary may hold entries no other member has: they
    # are rolled back, and no consumer may have seen them.
    async with open_cluster(
        shards=2, members=3, periodic_noop_s=0.2, election_timeout_s=0.3, replication_lag_s=0.02
    ) as cluster:

        def setup() -> Timestamp:
            c = client(cluster.uri)
            for ns in NAMESPACES.values():
                c.admin.command("shardCollection", ns, key={"_id": "hashed"})
            return c.admin.command("ping")["operationTime"]

        start = await sync(setup)
        proxy = Proxy(cluster.uri, tmp_path / "wireproxy.log")
        await proxy.start()
        written = Written()
        consumers = [Consumer(b, dict(high_water_mark(start))) for b in range(N_BUCKETS)]
        writes_done = trio.Event()

        async def writer() -> None:
            await sync(_write, cluster.uri, written, timeout=150)
            writes_done.set()

        async def consumer(con: Consumer) -> None:
            await sync(_consume, proxy.port, con, reader_processes, timeout=150)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer)
                for con in consumers:
                    nursery.start_soon(consumer, con)
                try:
                    await _faults(cluster, proxy, written, "shard0", "shard1")
                    await _faults(cluster, proxy, written, "shard1", "shard0")
                finally:
                    written.stop.set()
                kills = proxy.kills
                await writes_done.wait()
                end = await sync(_end_point, cluster.uri)
                for con in consumers:
                    con.end = end
            await sync(_close_all)  # while the proxy still answers
        finally:
            if proxy.process is not None and proxy.process.poll() is None:
                proxy.kill()
        assert kills == 6
        if reader_processes:
            assert proxy.children, "the proxy read the shards in reader processes"
        gone, alive = await trio.to_thread.run_sync(psutil.wait_procs, proxy.children, 30)
        assert not alive, f"reader processes outlived their proxy: {alive}"
        for con in consumers:
            _check(con, written)
        # Every consumer lost its cursor to the kills (a restart within its retry pause may be
        # met only once).
        assert all(con.resumes >= kills // 2 for con in consumers), [
            con.resumes for con in consumers
        ]
        assert sum(len(w) for w in written.ids.values()) >= N_BUCKETS * BATCH * 50
