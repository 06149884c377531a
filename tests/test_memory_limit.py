"""The proxy-wide memory limit: streams admitted by a floor plus what they hold, budgets that take
their bytes from one pool, reader processes counted at their size (buckets/memory_limit.py).

Refusals are ExceededMemoryLimit (146), the code a server gives an operation over its memory
limit (src/mongo/base/error_codes.yml in mongodb/mongo)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
import trio
import trio.testing
from bson import Timestamp
from pymongo.errors import OperationFailure

from buckets.budget import ByteBudget
from buckets.memory_limit import (
    BUCKET_FLOOR_BYTES,
    DEAL_HEADROOM_BYTES,
    READER_PROCESS_BYTES,
    SHARD_BATCH_BYTES,
    SHARD_FLOOR_BYTES,
    MemoryPool,
    stream_floor,
)
from mongoformats.errors import MongoError
from mongoformats.resume_token import high_water_mark, token_sort_key
from tests.conftest import _close_all, client, free_port, proxy_uri, scrape, sync, wait_until
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

MIB = 1 << 20
NS = "$cmd.parallelChangeStream"
SHARDS = 3  # the cluster fixture's


# -- the accounting, without sockets ---------------------------------------------------------


def test_an_account_counts_its_floor_or_what_it_holds_if_more():
    pool = MemoryPool(100 * MIB)
    acct = pool.account(10 * MIB, reader=False)
    assert (pool.counted, pool.held) == (10 * MIB, 0)
    assert acct.try_take(4 * MIB)
    assert (pool.counted, pool.held) == (10 * MIB, 4 * MIB)  # within its floor
    assert acct.try_take(20 * MIB)
    assert (pool.counted, pool.held) == (24 * MIB, 24 * MIB)
    acct.give(24 * MIB)
    assert pool.counted == 10 * MIB
    acct.close()
    assert (pool.counted, pool.floors, pool.held) == (0, 0, 0)
    assert acct.try_take(1 << 40)  # closed: its stream is going, nothing is counted any more
    assert pool.counted == 0


def test_a_reader_counts_the_batch_it_holds_in_hand_beside_its_budget():
    """A shard's reader reads a batch before its budget takes it, and holds it while it waits:
    its account counts one batch beside what the budget holds, within a floor of two."""
    pool = MemoryPool(1 << 40)
    shard = pool.account(SHARD_FLOOR_BYTES, reader=True, in_hand=SHARD_BATCH_BYTES)
    assert SHARD_FLOOR_BYTES == 2 * SHARD_BATCH_BYTES and pool.counted == SHARD_FLOOR_BYTES
    assert shard.try_take(SHARD_BATCH_BYTES)
    assert pool.counted == SHARD_FLOOR_BYTES  # one held, one in hand: the floor
    assert shard.try_take(MIB)
    assert pool.counted == SHARD_FLOOR_BYTES + MIB


def test_readers_leave_the_dealing_headroom_to_the_buckets():
    """A shard's read-ahead never takes the last DEAL_HEADROOM_BYTES: the merge needs them to
    deal an event larger than a bucket's floor, and only dealing frees what the shards hold."""
    pool = MemoryPool(SHARD_FLOOR_BYTES + BUCKET_FLOOR_BYTES + DEAL_HEADROOM_BYTES + 8 * MIB)
    shard = pool.account(SHARD_FLOOR_BYTES, reader=True, in_hand=SHARD_BATCH_BYTES)
    bucket = pool.account(BUCKET_FLOOR_BYTES, reader=False)
    assert shard.try_take(SHARD_BATCH_BYTES + 8 * MIB)
    assert not shard.try_take(1)
    assert bucket.try_take(BUCKET_FLOOR_BYTES + DEAL_HEADROOM_BYTES)
    assert not bucket.try_take(1)
    assert pool.counted == pool.limit
    assert pool.refusals == 2


def test_a_tiny_budget_admits_one_batch_and_the_pool_counts_it():
    """A 1-byte budget still takes a whole batch when it is empty (nothing can deadlock on a small
    budget); the pool counts those bytes, and a batch the pool has no room for waits."""
    pool = MemoryPool(2 * SHARD_FLOOR_BYTES + DEAL_HEADROOM_BYTES)
    budgets = [
        ByteBudget(1, pool.account(SHARD_FLOOR_BYTES, reader=True, in_hand=SHARD_BATCH_BYTES))
        for _ in range(2)
    ]
    batch = SHARD_BATCH_BYTES
    assert budgets[0].try_acquire(batch)  # within its floor
    assert not budgets[0].try_acquire(1)  # its own limit: one batch at a time
    assert not budgets[1].try_acquire(batch + 1)  # over its floor; the pool is full
    assert budgets[1].blocked_by_pool(batch + 1)
    assert pool.held == batch and pool.counted <= pool.limit
    budgets[0].release(batch)
    assert not budgets[0].try_acquire(batch + 1)  # nothing left above the floors
    assert budgets[1].try_acquire(batch)


def test_a_take_that_would_wait_first_sheds_what_other_accounts_only_cache():
    pool = MemoryPool(3 * MIB + DEAL_HEADROOM_BYTES)
    cache = pool.account(MIB, reader=False)
    assert cache.try_take(MIB + DEAL_HEADROOM_BYTES)

    def shed():
        cache.give(DEAL_HEADROOM_BYTES)

    cache.shed = shed
    other = pool.account(MIB, reader=False)
    assert other.try_take(3 * MIB)
    assert cache.held == MIB and pool.refusals == 0


def test_admission_counts_the_floor_and_the_reader_processes_to_start():
    pool = MemoryPool(stream_floor(3, 2) + DEAL_HEADROOM_BYTES + READER_PROCESS_BYTES)
    pool.check_admits(stream_floor(3, 2), 1, streams=0, shards=3, buckets=2, reader_processes=1)
    with pytest.raises(MongoError) as info:
        pool.check_admits(stream_floor(3, 2), 4, streams=0, shards=3, buckets=2, reader_processes=4)
    assert info.value.code == 146
    assert (
        "readerProcesses: 4 needs 4 more reader processes of 300 MiB each, but only 1 fit"
        in info.value.errmsg
    )
    assert "pass readerProcesses: 1 or fewer" in info.value.errmsg
    for _ in range(6):
        pool.account(SHARD_FLOOR_BYTES, reader=True)
    with pytest.raises(MongoError) as info:
        pool.check_admits(stream_floor(3, 2), 0, streams=1, shards=3, buckets=2, reader_processes=0)
    assert info.value.code == 146
    assert "needs 194 MiB to start (3 shards x 64 MiB + 2 buckets x 1 MiB)" in info.value.errmsg


async def test_a_budget_waiting_for_the_pool_resumes_when_another_gives_bytes_back():
    pool = MemoryPool(2 * MIB + DEAL_HEADROOM_BYTES + MIB)
    full = ByteBudget(1 << 30, pool.account(MIB, reader=True))
    waiting = ByteBudget(1 << 30, pool.account(MIB, reader=True))
    await full.acquire(2 * MIB)
    got = trio.Event()

    async def take() -> None:
        await waiting.acquire(2 * MIB)
        got.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take)
        await trio.testing.wait_all_tasks_blocked()
        assert not got.is_set() and pool.waiting
        full.release(MIB)
        await got.wait()
    assert pool.counted == pool.limit - DEAL_HEADROOM_BYTES


# -- the engine, through a proxy -------------------------------------------------------------


async def _proxy(cluster: Any, nursery: trio.Nursery, limit: int, **settings: Any) -> Any:
    config = ProxyConfig(upstream=cluster.uri, listen_port=0, memory_limit_bytes=limit, **settings)
    return await nursery.start(serve_proxy, config)


def _end_key(c: Any) -> bytes:
    c.admin.command("appendOplogNote", data={"test": "end"})
    ts = c.admin.command("ping")["operationTime"]
    return token_sort_key(high_water_mark(Timestamp(ts.time, ts.inc + 1)))


def _read_all(c: Any, cursor_id: int, end: bytes, *, timeout: float = 60) -> list[Any]:
    out: list[Any] = []

    def done() -> bool:
        reply = c.admin.command({"getMore": cursor_id, "collection": NS, "maxTimeMS": 200})[
            "cursor"
        ]
        out.extend(reply["nextBatch"])
        return token_sort_key(reply["postBatchResumeToken"]) >= end

    wait_until(done, timeout=timeout, interval=0)
    return out


async def test_streams_with_one_byte_budgets_cannot_hold_more_than_the_limit(cluster):
    """A budget always admits one batch, so a stream with 1-byte budgets still holds a batch a
    shard: such streams are admitted by their floor, until the limit is reached; then refused."""
    limit = 1200 * MIB
    floor = stream_floor(SHARDS, 1)
    async with trio.open_nursery() as nursery:
        proxy = await _proxy(cluster, nursery, limit)

        def work():
            c = client(proxy_uri(proxy))
            admitted = refused = 0
            for i in range(300):
                try:
                    c.admin.command(
                        {
                            "parallelChangeStream": 1,
                            "nBuckets": 1,
                            "name": f"tiny{i}",
                            "shardBufferBytes": 1,
                            "bucketBufferBytes": 1,
                        }
                    )
                    admitted += 1
                except OperationFailure as exc:
                    assert exc.code == 146, exc
                    assert "memory limit" in str(exc)
                    refused += 1
                assert admitted * floor <= limit, "admitted more streams than the limit holds"
                if refused >= 3:
                    break
            assert admitted == (limit - DEAL_HEADROOM_BYTES) // floor and refused == 3
            c.fill.c.insert_many([{"pad": "x" * 1000} for _ in range(2000)])
            wait_until(
                lambda: all(
                    sum(r.stats.events for r in s.readers.values())
                    for s in proxy.engine.streams.values()
                ),
                timeout=60,
            )
            memory = c.admin.command({"parallelChangeStreamStatus": 1})["memory"]
            assert memory["heldBytes"] > 0 and memory["reservedBytes"] <= limit
            assert memory["floorBytes"] == admitted * floor

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_reader_processes_that_do_not_fit_are_refused(cluster):
    """Each reader process counts its resident size (~300 MiB) under the limit: a stream asking for
    more than fit is refused with 146, naming how many would; one asking for what fits opens."""
    limit = stream_floor(SHARDS, 1) + DEAL_HEADROOM_BYTES + READER_PROCESS_BYTES + 10 * MIB
    async with trio.open_nursery() as nursery:
        proxy = await _proxy(cluster, nursery, limit)

        def work():
            c = client(proxy_uri(proxy))
            with pytest.raises(OperationFailure) as info:
                c.admin.command(
                    {
                        "parallelChangeStream": 1,
                        "nBuckets": 1,
                        "name": "many",
                        "readerProcesses": 8,
                        "shardBufferBytes": 16 * MIB,
                        "bucketBufferBytes": MIB,
                    }
                )
            assert info.value.code == 146
            assert "readerProcesses: 8 needs 8 more reader processes" in str(info.value)
            assert "pass readerProcesses: 1 or fewer" in str(info.value)
            assert not proxy.engine.reader_processes()  # none started for it
            c.admin.command(
                {"parallelChangeStream": 1, "nBuckets": 1, "name": "one", "readerProcesses": 1}
            )
            memory = c.admin.command({"parallelChangeStreamStatus": 1})["memory"]
            assert memory["readerProcessBytes"] == READER_PROCESS_BYTES
            assert memory["streamsRefused"] == 1

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_idle_streams_that_hold_little_do_not_refuse_a_new_one(cluster):
    """Six streams whose full budgets (the defaults: 1 GiB a shard, 64 MiB a bucket) are a third of
    the limit each: they hold next to nothing, so all six are admitted (reserving the budgets
    admitted three)."""
    full = SHARDS * (1 << 30) + 2 * (64 * MIB)
    port = free_port()
    async with trio.open_nursery() as nursery:
        proxy = await _proxy(cluster, nursery, 3 * full, metrics_port=port)

        def work():
            c = client(proxy_uri(proxy))
            for i in range(6):
                c.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "name": f"idle{i}"})
            memory = c.admin.command({"parallelChangeStreamStatus": 1})["memory"]
            assert memory["floorBytes"] == 6 * stream_floor(SHARDS, 2)
            assert memory["reservedBytes"] <= 3 * full
            figures = {
                ln.split()[0]: float(ln.split()[1])
                for ln in scrape(port)
                if ln.startswith("pcs_memory")
            }
            assert figures["pcs_memory_limit_bytes"] == 3 * full
            assert figures["pcs_memory_floor_bytes"] == 6 * stream_floor(SHARDS, 2)
            assert {
                "pcs_memory_reserved_bytes",
                "pcs_memory_held_bytes",
                "pcs_memory_reader_process_bytes",
                "pcs_memory_waits_total",
            } <= set(figures)

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_a_stream_waits_for_the_pool_and_resumes_when_another_consumer_drains(cluster):
    """Two streams whose consumers do not read fill their buckets (budgets far above the limit)
    until the proxy-wide pool is exhausted: they wait there, within the limit. Once one consumer
    drains its stream, the other goes on; each then reads every event, in order."""
    docs, size = 480, 64 * 1024  # 30 MiB of events, for each of the two streams
    floor = stream_floor(SHARDS, 1)
    limit = 2 * floor + DEAL_HEADROOM_BYTES + 4 * MIB  # 36 MiB above the floors, for the buckets
    async with trio.open_nursery() as nursery:
        proxy = await _proxy(cluster, nursery, limit)

        def work():
            c = client(proxy_uri(proxy))
            ids = {}
            for name in ("first", "second"):
                opened = c.admin.command(
                    {
                        "parallelChangeStream": 1,
                        "nBuckets": 1,
                        "name": name,
                        "bucketBufferBytes": 1 << 30,
                    }
                )
                ids[name] = opened["cursors"][0]["id"]
            for i in range(docs // 32):
                c.fill.c.insert_many([{"_id": i * 32 + k, "pad": "x" * size} for k in range(32)])
            end = _end_key(c)
            streams = proxy.engine.streams

            def dealt(name: str) -> int:
                return streams[name].buckets[0].dealt_total

            # The two buckets exhaust the pool (to within an event), far below their budgets.
            wait_until(lambda: proxy.engine.memory.counted > limit - MIB, timeout=60)
            memory = c.admin.command({"parallelChangeStreamStatus": 1})["memory"]
            assert memory["reservedBytes"] <= limit and memory["heldBytes"] <= limit
            assert memory["memoryWaits"] > 0
            blocked = min(("first", "second"), key=dealt)
            other = "second" if blocked == "first" else "first"
            stalled_at = dealt(blocked)
            assert stalled_at < docs
            # The other's consumer drains it: the blocked one goes on, with no read of its own.
            got = {other: _read_all(c, ids[other], end)}
            wait_until(lambda: dealt(blocked) > stalled_at, timeout=30)
            got[blocked] = _read_all(c, ids[blocked], end)
            for events in got.values():
                assert [e["documentKey"]["_id"] for e in events] == list(range(docs))
            assert proxy.engine.memory.counted <= limit

        await sync(work, timeout=180)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_a_reader_process_waits_for_the_pool_too(cluster):
    """A reader process sends only bytes the shard's budget and the pool granted it: with the pool
    exhausted by a stream nobody reads, its batches wait in the process, and nothing is lost."""
    docs, size = 480, 64 * 1024
    floor = stream_floor(SHARDS, 1)
    limit = 2 * floor + DEAL_HEADROOM_BYTES + 4 * MIB + READER_PROCESS_BYTES
    async with trio.open_nursery() as nursery:
        proxy = await _proxy(cluster, nursery, limit)

        def work():
            c = client(proxy_uri(proxy))
            ids = {}
            for name, processes in (("local", 0), ("remote", 1)):
                opened = c.admin.command(
                    {
                        "parallelChangeStream": 1,
                        "nBuckets": 1,
                        "name": name,
                        "bucketBufferBytes": 1 << 30,
                        "readerProcesses": processes,
                    }
                )
                ids[name] = opened["cursors"][0]["id"]
            for i in range(docs // 32):
                c.fill.c.insert_many([{"_id": i * 32 + k, "pad": "x" * size} for k in range(32)])
            end = _end_key(c)
            wait_until(lambda: proxy.engine.memory.waiting, timeout=60)
            assert proxy.engine.memory.counted <= limit
            for name in ("local", "remote"):
                events = _read_all(c, ids[name], end)
                assert [e["documentKey"]["_id"] for e in events] == list(range(docs))

        await sync(work, timeout=180)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


class _Channel:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, message: Any) -> None:
        self.sent.append(message)


async def test_a_reader_process_sends_only_what_was_granted_and_gives_back_what_is_too_little():
    """The reader process's side of the flow control (buckets/reader_worker.py): a tail asks for
    its batch's size and waits for the grant; once it has sent, it asks ahead for a batch as large;
    short of credit for a larger one, it gives back what it has, so a budget too small for both
    still admits the batch."""
    from buckets.reader_worker import _Credit

    channel = _Channel()
    credit = _Credit(7, channel)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        sent = trio.Event()

        async def send(n: int) -> None:
            await credit.spend(n)
            sent.set()

        nursery.start_soon(send, 100)
        await trio.testing.wait_all_tasks_blocked()
        assert channel.sent == [("want", 7, 100, 0)] and not sent.is_set()
        credit.grant(100)
        await sent.wait()
        assert channel.sent[-1] == ("want", 7, 100, 0)  # ahead, for the next batch
        assert len(channel.sent) == 2
        credit.grant(100)
        sent = trio.Event()
        nursery.start_soon(send, 150)
        await trio.testing.wait_all_tasks_blocked()
        assert channel.sent[-1] == ("want", 7, 150, 100) and credit.available == 0
        credit.grant(150)
        await sent.wait()
        assert channel.sent[-1] == ("want", 7, 150, 0)


async def test_a_watch_that_shapes_in_worker_processes_counts_them(cluster):
    """An accelerated watch() with stages and readerProcesses applies the stages in as many worker
    processes of its own (buckets/shaping.py): its stream counts them beside its floor; with no
    room for them, the watch() is passed through to mongos, which serves the same events."""
    floor = stream_floor(SHARDS, 1)
    limit = floor + DEAL_HEADROOM_BYTES + 2 * READER_PROCESS_BYTES
    async with trio.open_nursery() as nursery:
        proxy = await _proxy(
            cluster, nursery, limit, accelerate_change_streams=True, reader_processes=1
        )

        def work():
            c = client(proxy_uri(proxy))
            project = [{"$project": {"documentKey": 1}}]
            with c.shaped.c.watch(project, max_await_time_ms=300) as watch:
                c.shaped.c.insert_one({"_id": 1})
                assert watch.next()["documentKey"] == {"_id": 1}
                memory = c.admin.command({"parallelChangeStreamStatus": 1})["memory"]
                assert memory["floorBytes"] == floor + READER_PROCESS_BYTES  # its shaping process
                assert memory["readerProcessBytes"] == READER_PROCESS_BYTES
                assert proxy.engine.watches == {"accelerated": 1, "passedThrough": 0}
                # A second one: its floor and shaping process do not fit beside the first's.
                with c.shaped.c.watch(project, max_await_time_ms=300) as more:
                    c.shaped.c.insert_one({"_id": 2})
                    assert more.next()["documentKey"] == {"_id": 2}
                assert proxy.engine.watches == {"accelerated": 1, "passedThrough": 1}

        await sync(work)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_a_read_stream_goes_on_beside_abandoned_ones_that_exhaust_the_pool(cluster):
    """Streams nobody reads fill the pool; a stream whose buckets are all read keeps going on its
    floors (a batch a shard, a few events a bucket), and returns every event in order."""
    docs, size = 640, 64 * 1024  # 40 MiB of large events, beside small ones
    limit = 3 * stream_floor(SHARDS, 2) + DEAL_HEADROOM_BYTES + 8 * MIB + READER_PROCESS_BYTES
    async with trio.open_nursery() as nursery:
        proxy = await _proxy(cluster, nursery, limit)

        def attach_and_read(token: Any, bucket: int, end: bytes) -> list[Any]:
            c = client(proxy_uri(proxy))  # a consumer of its own: its cursor, its session
            cursor = c.admin.command(
                {"parallelChangeStream": 1, "name": "live", "bucket": bucket, "resumeAfter": token}
            )["cursor"]
            return _read_all(c, cursor["id"], end, timeout=120)

        def work():
            c = client(proxy_uri(proxy))
            for name, processes in (("gone", 0), ("gone-too", 1)):
                c.admin.command(
                    {
                        "parallelChangeStream": 1,
                        "nBuckets": 2,
                        "name": name,
                        "readerProcesses": processes,
                    }
                )
            # The opener leaves (Spark's driver): each bucket is attached by a worker of its own.
            opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "name": "live"})
            c.admin.command(
                {"killCursors": NS, "cursors": [cur["id"] for cur in opened["cursors"]]}
            )
            for i in range(docs // 32):
                c.big.c.insert_many([{"_id": i * 32 + k, "pad": "x" * size} for k in range(32)])
                c.small.c.insert_many([{"_id": i * 32 + k} for k in range(32)])
            end = _end_key(c)
            with concurrent.futures.ThreadPoolExecutor(2) as workers:
                reads = [
                    workers.submit(attach_and_read, cur["postBatchResumeToken"], cur["bucket"], end)
                    for cur in opened["cursors"]
                ]
                events = [e for read in reads for e in read.result()]
            for db in ("big", "small"):
                ids = [e["documentKey"]["_id"] for e in events if e["ns"]["db"] == db]
                assert ids == list(range(docs)), db
            memory = c.admin.command({"parallelChangeStreamStatus": 1})["memory"]
            assert memory["memoryWaits"] > 0 and memory["reservedBytes"] <= limit

        await sync(work, timeout=180)
        await sync(_close_all)
        nursery.cancel_scope.cancel()
