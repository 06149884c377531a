"""Attaching one bucket of a named stream: without a token the cursor returns every event of the
bucket from the stream's start point, whether the bucket still retains them or a replay of the
oplogs has to re-read them (buckets/engine.py's module docstring states the contract); cursors
that are never read (an opener's, beside workers attached to each bucket) hold nothing back."""

from __future__ import annotations

from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument

from buckets.bucketing import bucket_of
from tests.conftest import _close_all, client, poll_until, proxy_uri, sync
from tests.integration.test_resume_exactly_once import _read

NS = "$cmd.parallelChangeStream"


def _next(c: Any, cursor_id: int, n: int) -> list[RawBSONDocument]:
    """One getMore's events (at most `n`, waiting for none)."""
    r = c.admin.command(
        {"getMore": cursor_id, "collection": NS, "batchSize": n, "maxTimeMS": 0},
        codec_options=bson.CodecOptions(document_class=RawBSONDocument),
    )
    return list(r["cursor"]["nextBatch"])


def _ids(events: list[RawBSONDocument]) -> list[int]:
    return [e["documentKey"]["_id"] for e in events]


async def test_an_attach_without_a_token_returns_what_the_stream_holds(cluster, proxy):
    """5 inserts dealt into the bucket after the open and before the attach: all 5 come back
    (starting at the bucket's live end skipped them)."""
    c = client(proxy_uri(proxy))
    await sync(c.admin.command, {"parallelChangeStream": 1, "nBuckets": 1, "name": "held"})
    await sync(c.att.held.insert_many, [{"_id": i} for i in range(5)])
    stream = proxy.engine.streams["held"]
    await poll_until(lambda: stream.buckets[0].end >= 5, 30)
    attached = await sync(c.admin.command, {"parallelChangeStream": 1, "name": "held", "bucket": 0})
    events = await sync(_read, c, attached["cursor"]["id"], 5)
    assert _ids(events) == list(range(5))
    await sync(_close_all)


async def test_an_attach_without_a_token_replays_what_retention_dropped(cluster, proxy):
    """The opener reads far more than the bucket budget, so retention drops the stream's start:
    an attach without a token is served by a replay and still returns every event, in order,
    and then the events written after the attach."""
    c = client(proxy_uri(proxy))
    opened = await sync(
        c.admin.command,
        {
            "parallelChangeStream": 1,
            "nBuckets": 1,
            "name": "dropped",
            "bucketBufferBytes": 16 << 10,
        },
    )
    n = 400
    await sync(c.att.dropped.insert_many, [{"_id": i} for i in range(n)])
    first = await sync(_read, c, opened["cursors"][0]["id"], n)
    assert _ids(first) == list(range(n))
    stream = proxy.engine.streams["dropped"]
    bucket = stream.buckets[0]
    assert bucket.position_after(bucket.start_floor) is None, "retention dropped the start"
    attached = await sync(
        c.admin.command, {"parallelChangeStream": 1, "name": "dropped", "bucket": 0}
    )
    assert stream.replays == 1
    await sync(c.att.dropped.insert_many, [{"_id": i} for i in range(n, n + 20)])
    # The opener reads on too: a cursor that stops reading pins its bucket's retention.
    assert _ids(await sync(_read, c, opened["cursors"][0]["id"], 20)) == list(range(n, n + 20))
    events = await sync(_read, c, attached["cursor"]["id"], n + 20)
    assert _ids(events) == list(range(n + 20))
    await sync(_close_all)


def _one_namespace_per_bucket(n: int) -> dict[int, str]:
    names: dict[int, str] = {}
    for k in range(100):
        names.setdefault(bucket_of(f"hol.c{k}", n), f"hol.c{k}")
    assert len(names) == n
    return names


@pytest.mark.parametrize("with_token", [False, True])
async def test_workers_attached_beside_an_unread_open_get_a_backlog_of_many_budgets(
    cluster, proxy, with_token
):
    """A driver opens the stream (4 cursors it never reads) and 4 workers attach one bucket
    each, from the open's postBatchResumeToken or without a token; a backlog of several bucket
    budgets per bucket is written: the opener's unread cursors pin no retention, so the merge
    goes on, and every worker gets every event of its bucket, in order."""
    budget = 16 << 10
    c = client(proxy_uri(proxy))
    opened = await sync(
        c.admin.command,
        {"parallelChangeStream": 1, "nBuckets": 4, "name": "hol", "bucketBufferBytes": budget},
    )
    workers = {}
    for cur in opened["cursors"]:
        cmd = {"parallelChangeStream": 1, "name": "hol", "bucket": cur["bucket"]}
        if with_token:
            cmd["resumeAfter"] = cur["postBatchResumeToken"]
        workers[cur["bucket"]] = (await sync(c.admin.command, cmd))["cursor"]["id"]
    names = _one_namespace_per_bucket(4)
    per_ns = 4 * budget // 400 + 1  # events of over 400 bytes: 4 budgets per bucket
    pad = "x" * 400

    def write() -> None:
        for lo in range(0, per_ns, 20):
            for ns in names.values():
                db, coll = ns.split(".")
                c[db][coll].insert_many(
                    [{"_id": i, "pad": pad} for i in range(lo, min(lo + 20, per_ns))]
                )

    await sync(write)
    got: dict[int, list[RawBSONDocument]] = {b: [] for b in workers}

    def read_all() -> None:
        """The workers read side by side (round robin), as concurrent workers do."""
        while any(len(events) < per_ns for events in got.values()):
            for b, cid in workers.items():
                if len(got[b]) < per_ns:
                    got[b] += _next(c, cid, per_ns - len(got[b]))

    await sync(read_all)
    for b, events in got.items():
        assert {f"{e['ns']['db']}.{e['ns']['coll']}" for e in events} == {names[b]}
        assert _ids(events) == list(range(per_ns))
    assert all(cur["id"] in proxy.engine.cursors for cur in opened["cursors"]), (
        "the opener's cursors live on"
    )
    await sync(_close_all)


async def test_an_unread_cursor_whose_events_were_dropped_reads_them_from_a_replay(cluster, proxy):
    """The opener's cursor is never read while a worker on the same bucket reads far past the
    budget, so retention drops what the opener has not read; its first getMore is then served
    by a replay of the oplogs: every event, in order, then the live ones."""
    c = client(proxy_uri(proxy))
    opened = await sync(
        c.admin.command,
        {"parallelChangeStream": 1, "nBuckets": 1, "name": "cache", "bucketBufferBytes": 16 << 10},
    )
    worker = (
        await sync(c.admin.command, {"parallelChangeStream": 1, "name": "cache", "bucket": 0})
    )["cursor"]["id"]
    n = 300
    await sync(c.att.cache.insert_many, [{"_id": i, "pad": "x" * 200} for i in range(n)])
    assert _ids(await sync(_read, c, worker, n)) == list(range(n))
    stream = proxy.engine.streams["cache"]
    assert stream.buckets[0].base > 0, "retention dropped what the opener had not read"
    opener = opened["cursors"][0]["id"]
    assert _ids(await sync(_read, c, opener, n)) == list(range(n))
    assert stream.replays == 1
    await sync(c.att.cache.insert_many, [{"_id": i} for i in range(n, n + 10)])
    assert _ids(await sync(_read, c, worker, 10)) == list(range(n, n + 10))
    assert _ids(await sync(_read, c, opener, 10)) == list(range(n, n + 10))
    await sync(_close_all)
