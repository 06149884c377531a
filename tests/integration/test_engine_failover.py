"""The engine across replica-set failures: a member stopped mid-stream, a primary stepdown, a
failover.

Writes go on while the members the readers depend on are stopped and primaries change. Each bucket
must still deliver every committed write once, in order, and the union must equal what mongos's
stream would deliver (tests/integration/test_engine.reference) — zero lost, zero duplicated.
"""

from __future__ import annotations

import contextlib

import bson
import psutil
import pytest
import trio
from bson.raw_bson import RawBSONDocument
from pymongo.errors import OperationFailure

from buckets.bucketing import bucket_of
from simcluster import open_cluster
from tests.conftest import (
    _close_all,
    client,
    free_port,
    poll_until,
    proxy_uri,
    scrape,
    sync,
    wait_until,
)
from tests.integration.test_engine import drain, end_point, key, reference
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

N_BUCKETS = 4
NAMESPACES = ["fo.h", "fo.a", "fo.b", "fx.c"]


@pytest.mark.parametrize("reader_processes", [0, 1])
async def test_no_event_lost_or_duplicated_across_member_stop_stepdown_and_failover(
    reader_processes,
):
    """With readerProcesses 1 the tails reconnect inside a reader process."""
    # Secondaries trail by 20 ms, so a stopped primary always holds entries nobody else has: they
    # are rolled back, and no bucket may ever have shown them.
    async with (
        open_cluster(
            shards=2, members=3, periodic_noop_s=0.2, election_timeout_s=0.3, replication_lag_s=0.02
        ) as cluster,
        trio.open_nursery() as nursery,
    ):
        proxy = await nursery.start(serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0))
        c = client(proxy_uri(proxy))
        written = [0]

        def open_stream():
            c.admin.command("shardCollection", "fo.h", key={"_id": "hashed"})
            start = c.admin.command("ping")["operationTime"]
            opened = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": N_BUCKETS,
                    "name": "failover",
                    "startAtOperationTime": start,
                    "showExpandedEvents": True,
                    "readerProcesses": reader_processes,
                }
            )
            return start, opened

        start, opened = await sync(open_stream)
        total = 600
        async with trio.open_nursery() as writers:
            writers.start_soon(sync, _write, proxy, total, written)
            await _written(written, 100)
            # 1. The member shard0's reader tails (a secondary) is stopped mid-stream.
            rs0 = cluster.replsets["shard0"]
            host = (await sync(_shard_status, c, "failover", "shard0"))["host"]
            tailed = next(m for m in rs0.members if m.address == host)
            assert not tailed.is_primary, "the reader prefers a secondary"
            rs0.stop_member(tailed)
            await _written(written, 200)
            await rs0.restart_member(
                tailed
            )  # back before the next failure: a majority must stay up
            await _written(written, 250)
            # 2. shard1's primary steps down; a secondary takes over in a new term.
            rs1 = cluster.replsets["shard1"]
            await rs1.step_down(rs1.primary, 60, 10, False)
            await _written(written, 400)
            # 3. shard0's primary is stopped: an election after electionTimeout, writes retried.
            old_primary = rs0.primary
            # A w:1 write no secondary has yet, then the crash: the write is rolled back.
            old_primary.insert_one("fo.rolledback", {"_id": "phantom"}, {})
            rs0.stop_member(old_primary)
            await _written(written, 500)
            await rs0.restart_member(old_primary)

        await sync(_every_write_once, cluster, c, start, opened, total)
        assert old_primary.coll("fo.rolledback") is None, (
            "the returning member rolled the write back"
        )
        status = await sync(
            lambda: c.admin.command({"parallelChangeStreamStatus": 1, "name": "failover"})
        )
        assert sum(s["reconnects"] for s in status["streams"][0]["shards"]) >= 1
        # Which reader process reads each shard (None: the proxy process).
        assert {s["readerProcess"] for s in status["streams"][0]["shards"]} == (
            {0} if reader_processes else {None}
        )
        assert bson.encode(status)  # the status document stays valid BSON through it all
        await sync(_close_all)
        nursery.cancel_scope.cancel()


def _write(proxy, total, written) -> None:
    """Inserts _id 0..total-1 over NAMESPACES, 10 per namespace at a time; `written[0]` counts those
    acknowledged. Retryable writes through the proxy: pymongo retries once on the errors a failover
    gives. Each waits for majority, i.e. for the secondaries' lag.

    On a client of its own: the buckets' cursors were opened in the reading client's implicit
    session, and a getMore must come in the same one; writes on that client from this thread
    would reorder its session pool."""
    c = client(proxy_uri(proxy))
    for i in range(0, total, 40):
        for j, ns in enumerate(NAMESPACES):
            db, coll = ns.split(".")
            c[db][coll].insert_many([{"_id": k} for k in range(i + j, i + 40, 4)])
        written[0] = i + 40


async def _written(written, n) -> None:
    """Wait until `_write` has had `n` inserts acknowledged."""
    await poll_until(lambda: written[0] >= n, 60, interval=0.02)


def _shard_status(c, stream, shard):
    status = c.admin.command({"parallelChangeStreamStatus": 1, "name": stream})
    return next(s for s in status["streams"][0]["shards"] if s["shard"] == shard)


def _every_write_once(cluster, c, start, opened, total) -> None:
    """The union of the buckets' events up to now, checked: each bucket in token order with no
    repeat and only its namespaces, the union mongos's stream
    (tests/integration/test_engine.reference), each of the `total` inserts once, and per namespace
    in write order."""
    end = end_point(c)
    union: dict[bytes, RawBSONDocument] = {}
    for cur in opened["cursors"]:
        events = drain(c, cur["id"], end, timeout=60)
        keys = [key(e["_id"]) for e in events]
        assert keys == sorted(keys) and len(set(keys)) == len(keys), (
            "a bucket repeated or reordered"
        )
        for e in events:
            if "coll" in e["ns"]:
                assert bucket_of(f"{e['ns']['db']}.{e['ns']['coll']}", N_BUCKETS) == cur["bucket"]
            union[key(e["_id"])] = e
    assert sorted(union) == reference(cluster, start, end)
    inserted = sorted(
        e["documentKey"]["_id"] for e in union.values() if e["operationType"] == "insert"
    )
    assert inserted == list(range(total)), "every committed insert exactly once"
    for ns in NAMESPACES:
        db, coll = ns.split(".")
        ids = [
            e["documentKey"]["_id"]
            for _, e in sorted(union.items())
            if e["operationType"] == "insert" and e["ns"] == {"db": db, "coll": coll}
        ]
        assert ids == sorted(ids)


@pytest.mark.parametrize("reader_processes", [0, 1])
async def test_a_hung_member_is_given_up_after_the_upstream_timeout(reader_processes):
    """A member that stops answering but keeps its sockets open (SIGSTOP, or a partition that
    drops packets): TCP alone would wait hours. The reader gives up on it after
    upstream_timeout_s and reads on from another member; a hung primary is replaced by an
    election. Nothing is lost or repeated, and the hung primary's unreplicated write never shows."""
    async with (
        open_cluster(
            shards=2, members=3, periodic_noop_s=0.2, election_timeout_s=0.3, replication_lag_s=0.02
        ) as cluster,
        trio.open_nursery() as nursery,
    ):
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(
                upstream=cluster.uri,
                listen_port=0,
                upstream_timeout_s=1,
                reader_processes=reader_processes,
            ),
        )
        c = client(proxy_uri(proxy))
        written = [0]

        def open_stream():
            start = c.admin.command("ping")["operationTime"]
            return start, c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": N_BUCKETS,
                    "name": "hung",
                    "startAtOperationTime": start,
                    "showExpandedEvents": True,
                }
            )

        def shard_status(shard):
            return _shard_status(c, "hung", shard)

        start, opened = await sync(open_stream)
        total = 400
        async with trio.open_nursery() as writers:
            writers.start_soon(sync, _write, proxy, total, written)
            await _written(written, 100)
            rs0, rs1 = cluster.replsets["shard0"], cluster.replsets["shard1"]
            host = (await sync(shard_status, "shard0"))["host"]
            tailed = next(m for m in rs0.members if m.address == host)
            assert not tailed.is_primary, "the reader prefers a secondary"
            rs0.pause_member(tailed)
            # Given up after the getMore's maxTimeMS and the 1 s timeout, well before TCP would.
            await sync(wait_until, lambda: shard_status("shard0")["host"] != host, 10, 0.1)
            await _written(written, 200)
            # shard1's primary hangs holding a write nobody else has: it is rolled back at resume.
            old_primary = rs1.primary
            old_primary.insert_one("fo.rolledback", {"_id": "phantom"}, {})
            rs1.pause_member(old_primary)
            await _written(written, 300)
            rs0.resume_member(tailed)
            rs1.resume_member(old_primary)

        await sync(_every_write_once, cluster, c, start, opened, total)
        await poll_until(lambda: old_primary.in_sync, 30)
        assert old_primary.coll("fo.rolledback") is None, "the hung primary's write was rolled back"
        assert (await sync(shard_status, "shard0"))["reconnects"] >= 1
        await sync(_close_all)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("how", ["killed", "hung"])
async def test_a_killed_or_hung_reader_process_fails_its_stream_and_buckets_resume_from_tokens(
    cluster, how
):
    """readerProcesses: the process reading the shards dies, or stops (SIGSTOP) and is killed
    once it has answered nothing for upstream_timeout_s. The stream fails with InternalError
    (never a silent gap, nor a silent stall); a stream reopened from the buckets' last tokens
    delivers the rest, once."""
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(
            serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0, upstream_timeout_s=2)
        )
        await sync(_killed_or_hung, cluster, proxy, how)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


def _killed_or_hung(cluster, proxy, how):
    earlier = _reader_processes()  # an earlier test's, not yet gone
    c = client(proxy_uri(proxy))
    start = c.admin.command("ping")["operationTime"]
    opened = c.admin.command(
        {
            "parallelChangeStream": 1,
            "nBuckets": 2,
            "name": "doomed",
            "startAtOperationTime": start,
            "readerProcesses": 1,
            "showExpandedEvents": True,
        }
    )
    c.kp.a.insert_many([{"_id": i} for i in range(50)])
    c.kp.b.insert_many([{"_id": i} for i in range(50)])
    end = end_point(c)
    seen: dict[bytes, RawBSONDocument] = {}
    tokens = []
    for cur in opened["cursors"]:  # the first part, read before the process dies
        events = drain(c, cur["id"], end)
        seen.update((key(e["_id"]), e) for e in events)
        tokens.append(events[-1]["_id"] if events else cur["postBatchResumeToken"])
    workers = [psutil.Process(pid) for pid in _reader_processes() - earlier]
    assert workers, "the stream's reader process"
    for p in workers:
        if how == "killed":
            p.kill()
        else:
            p.suspend()
    with pytest.raises(OperationFailure) as info:
        for _ in range(100):
            c.admin.command(
                {
                    "getMore": opened["cursors"][0]["id"],
                    "collection": "$cmd.parallelChangeStream",
                    "maxTimeMS": 100,
                }
            )
    assert info.value.code == 1 and "reader process" in str(info.value)
    if how == "hung":
        assert "hung" in str(info.value)
        for p in workers:
            p.wait(10)  # killed, not left stopped
    c.kp.a.insert_many([{"_id": i} for i in range(50, 80)])
    end = end_point(c)
    again = c.admin.command(
        {
            "parallelChangeStream": 1,
            "nBuckets": 2,
            "name": "again",
            "resumeAfter": tokens,
            "readerProcesses": 1,
            "showExpandedEvents": True,
        }
    )
    for cur in again["cursors"]:
        for e in drain(c, cur["id"], end):
            assert key(e["_id"]) not in seen, "delivered twice"
            seen[key(e["_id"])] = e
    assert sorted(seen) == reference(cluster, start, end)
    assert sum(e["operationType"] == "insert" for e in seen.values()) == 130


def _reader_processes() -> set[int]:
    """Live reader processes of this test process (trio_parallel's workers)."""
    pids = set()
    for p in psutil.Process().children(recursive=True):
        # An earlier test's worker may exit between the listing and this look (NoSuchProcess, or
        # ZombieProcess until it is reaped): it is no reader of this test's.
        with contextlib.suppress(psutil.Error):
            if "spawn_main" in " ".join(p.cmdline()):
                pids.add(p.pid)
    return pids


async def test_streams_share_the_engines_reader_processes(cluster):
    """Reader processes belong to the engine: a second stream (and an accelerated watch()) reads
    through the process the first one started, a stream torn down stops only its own tails, and a
    process left with nothing to read is stopped."""
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(
            serve_proxy,
            ProxyConfig(
                upstream=cluster.uri,
                listen_port=0,
                reader_processes=1,
                accelerate_change_streams=True,
                stream_idle_teardown_s=0.5,
                reader_idle_s=1.0,
            ),
        )

        def work():
            c = client(proxy_uri(proxy))
            start = c.admin.command("ping")["operationTime"]
            before = _reader_processes()
            a = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 1,
                    "name": "a",
                    "startAtOperationTime": start,
                }
            )
            started = _reader_processes() - before
            assert len(started) == 1
            b = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 1,
                    "name": "b",
                    "startAtOperationTime": start,
                }
            )
            with c.sp.x.watch(start_at_operation_time=start, max_await_time_ms=200) as watched:
                assert (
                    _reader_processes() - before == started
                )  # no process started for b or the watch()
                c.sp.x.insert_one({"_id": 1})
                assert watched.next()["documentKey"] == {"_id": 1}
            c.admin.command(
                {"killCursors": "$cmd.parallelChangeStream", "cursors": [a["cursors"][0]["id"]]}
            )
            wait_until(
                lambda: (
                    [
                        s["name"]
                        for s in c.admin.command({"parallelChangeStreamStatus": 1})["streams"]
                    ]
                    == ["b"]
                )
            )  # (the status of a stream by name would keep it alive)
            c.sp.x.insert_one({"_id": 2})
            end = end_point(c)
            got = [
                bson.decode(e.raw)["documentKey"]
                for e in drain(c, b["cursors"][0]["id"], end)
                if e["operationType"] == "insert"
            ]
            assert got == [
                {"_id": 1},
                {"_id": 2},
            ]  # b read on after a's tails stopped in the shared process
            assert _reader_processes() - before == started
            status = c.admin.command({"parallelChangeStreamStatus": 1})
            shards = len(status["streams"][0]["shards"])
            assert status["readerProcesses"] == [
                {"index": 0, "alive": True, "tails": shards}
            ]  # b's alone
            # With no stream left, the process reads nothing: it is stopped after reader_idle_s.
            c.admin.command(
                {"killCursors": "$cmd.parallelChangeStream", "cursors": [b["cursors"][0]["id"]]}
            )
            wait_until(lambda: not started & _reader_processes())
            assert (
                c.admin.command({"parallelChangeStreamStatus": 1})["readerProcesses"][0]["alive"]
                is False
            )

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_a_stalled_stream_never_holds_up_another_in_a_shared_reader_process(cluster, proxy):
    """Two streams read through one reader process. Nobody reads the first, so its bucket fills and
    its merge stops; the second must read on (its own consumer, its own pace). A stall must stay
    the stalled stream's own, as it does without reader processes."""

    def work():
        c = client(proxy_uri(proxy))
        start = c.admin.command("ping")["operationTime"]
        stalled = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 1,
                "name": "stalled",
                "startAtOperationTime": start,
                "readerProcesses": 1,
                "bucketBufferBytes": 1,
            }
        )
        live = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 1,
                "name": "live",
                "startAtOperationTime": start,
                "readerProcesses": 1,
            }
        )
        got = 0
        for i in range(
            60
        ):  # one write a batch: far more batches than a stream's merge channel holds
            c.hl.x.insert_one({"_id": i, "pad": "x" * 1000})
            if i % 10 == 9:
                end = end_point(c)
                got += sum(
                    e["operationType"] == "insert"
                    for e in drain(c, live["cursors"][0]["id"], end, 20)
                )
        assert got == 60
        assert stalled["cursors"][0]["id"]  # still open, still unread

    await sync(work)


@pytest.mark.parametrize("members", [1, 3])
async def test_a_shard_with_no_member_up_holds_the_stream_back_and_status_says_why(members):
    """Every member of a shard is down: nothing the other shards write may be delivered (the lost
    shard may still hold something earlier), so the buckets wait rather than skip it, and
    status and /metrics name the lost shard and the reason. When it is back (its members elect a
    primary again), every write comes once."""
    port = free_port()
    async with (
        open_cluster(
            shards=2, members=members, periodic_noop_s=0.2, election_timeout_s=0.3
        ) as cluster,
        trio.open_nursery() as nursery,
    ):
        proxy = await nursery.start(
            serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0, metrics_port=port)
        )
        c = client(proxy_uri(proxy))
        on = {
            cluster.mongos.primary_of(db).set_name: db for db in ("d0", "d1")
        }  # one database per shard
        lost_rs = cluster.replsets["shard1"]

        def shard1():
            return _shard_status(c, "held", "shard1")

        def before_the_outage():
            start = c.admin.command("ping")["operationTime"]
            opened = c.admin.command(
                {
                    "parallelChangeStream": 1,
                    "nBuckets": 1,
                    "name": "held",
                    "startAtOperationTime": start,
                    "showExpandedEvents": True,
                }
            )
            for db in on.values():
                c[db].c.insert_many([{"_id": i} for i in range(10)])
            first = drain(c, opened["cursors"][0]["id"], end_point(c))
            assert shard1()["connected"] and shard1()["lastError"] is None
            return start, opened, first

        def during_the_outage(cursor_id):
            c[on["shard0"]].c.insert_many([{"_id": i} for i in range(10, 20)])  # shard0 writes on
            wait_until(lambda: not shard1()["connected"], 10, 0.1)
            assert "cannot connect" in shard1()["lastError"] or "closed" in shard1()["lastError"]
            assert 'pcs_shard_connected{shard="shard1",stream="held"} 0.0' in scrape(port)
            reply = c.admin.command(
                {"getMore": cursor_id, "collection": "$cmd.parallelChangeStream", "maxTimeMS": 500}
            )
            assert reply["cursor"]["nextBatch"] == [], (
                "held back until shard1 can promise nothing earlier"
            )

        start, opened, first = await sync(before_the_outage)
        for member in lost_rs.members:
            lost_rs.stop_member(member)
        await sync(during_the_outage, opened["cursors"][0]["id"])
        for member in lost_rs.members:
            await lost_rs.restart_member(member)
        await lost_rs.wait_primary(10)

        def after_it():
            c[on["shard1"]].c.insert_many([{"_id": i} for i in range(10, 20)])
            end = end_point(c)
            keys = [key(e["_id"]) for e in first + drain(c, opened["cursors"][0]["id"], end)]
            assert keys == reference(cluster, start, end), "every event once, in order"
            assert sum(b"insert" in k for k in keys) == 40 and shard1()["connected"]
            assert (
                shard1()["lastError"] is not None and shard1()["lastErrorAt"] is not None
            )  # kept for the record

        await sync(after_it)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_a_reader_whose_cursor_timed_out_behind_a_full_buffer_reads_on_from_its_position(
    cluster, proxy
):
    """Nobody reads the stream, so its shard's buffer fills and the reader stops taking batches;
    the member's exhaust stream then waits on TCP, and its cursor (opened outside any session,
    as the readers' are) sits idle past cursorTimeoutMillis and is timed out. When the consumer
    comes, the reader finds its cursor gone (CursorNotFound) and reads on from its position on a
    new one: every event once, in order."""
    # ~100 MB on one shard: more than the reader takes before its budget stops it (up to two 16
    # MiB replies) and than the sockets' buffers then hold (the receiver's grows to tcp_rmem's
    # maximum, 32 MiB here), so the member's stream waits on TCP with its cursor idle.
    total = 6400

    def work():
        c = client(proxy_uri(proxy))
        start = c.admin.command("ping")["operationTime"]
        for at in range(0, total, 400):
            c.tmo.c.insert_many([{"_id": i, "pad": "t" * 16_000} for i in range(at, at + 400)])
        shard = cluster.mongos.primary_of("tmo").set_name
        members = [
            client(f"mongodb://{m.address}/?directConnection=true")
            for m in cluster.replsets[shard].members
        ]
        for m in members:
            m.admin.command({"setParameter": 1, "cursorTimeoutMillis": 500})
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 1,
                "name": "timeout",
                "startAtOperationTime": start,
                "shardBufferBytes": 1 << 20,
                "bucketBufferBytes": 1 << 20,
            }
        )
        wait_until(
            lambda: sum(
                m.admin.command("serverStatus")["metrics"]["cursor"]["timedOut"] for m in members
            ),
            timeout=30,
        )
        for m in (
            members
        ):  # the default again: a drain held back by the small budgets stalls it again and again
            m.admin.command({"setParameter": 1, "cursorTimeoutMillis": 600_000})
        events = drain(c, opened["cursors"][0]["id"], end_point(c), timeout=120)
        ids = [
            e["documentKey"]["_id"]
            for e in events
            if e["operationType"] == "insert" and e["ns"]["db"] == "tmo"
        ]
        assert ids == list(range(total))
        assert [key(e["_id"]) for e in events] == sorted({key(e["_id"]) for e in events})
        assert _shard_status(c, "timeout", shard)["reconnects"] >= 1

    await sync(work)
