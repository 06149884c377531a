"""The proxy-wide memory limit: streams admitted by a floor plus what they hold, budgets that take
their bytes from one pool, reader processes counted at their size (buckets/memory_limit.py),
here with the engine through a proxy; tests/unit/test_memory_limit.py checks the accounting.

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

from buckets.memory_limit import (
    DEAL_HEADROOM_BYTES,
    READER_PROCESS_BYTES,
    stream_floor,
)
from mongoformats.resume_token import high_water_mark, token_sort_key
from tests.conftest import _close_all, client, free_port, proxy_uri, scrape, sync, wait_until
from tests.unit.test_memory_limit import MIB
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

NS = "$cmd.parallelChangeStream"
SHARDS = 3  # the cluster fixture's


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
