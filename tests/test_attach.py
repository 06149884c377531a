"""Attaching one bucket of a named stream without a token: the cursor returns every event of the
bucket from the stream's start point, whether the bucket still retains them or a replay of the
oplogs has to re-read them (buckets/engine.py's module docstring states the contract)."""

from __future__ import annotations

from typing import Any

import bson
from bson.raw_bson import RawBSONDocument

from tests.conftest import _close_all, client, poll_until, proxy_uri, sync

NS = "$cmd.parallelChangeStream"


def _read(c: Any, cursor_id: int, n: int) -> list[RawBSONDocument]:
    """The next `n` events of a bucket cursor (getMores until they have come)."""
    out: list[RawBSONDocument] = []
    while len(out) < n:
        r = c.admin.command(
            {"getMore": cursor_id, "collection": NS, "batchSize": n - len(out), "maxTimeMS": 300},
            codec_options=bson.CodecOptions(document_class=RawBSONDocument),
        )
        out += list(r["cursor"]["nextBatch"])
    return out


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
    opened = await sync(c.admin.command, {"parallelChangeStream": 1, "nBuckets": 1, "name": "dropped",
                                          "bucketBufferBytes": 16 << 10})
    n = 400
    await sync(c.att.dropped.insert_many, [{"_id": i} for i in range(n)])
    first = await sync(_read, c, opened["cursors"][0]["id"], n)
    assert _ids(first) == list(range(n))
    stream = proxy.engine.streams["dropped"]
    bucket = stream.buckets[0]
    assert bucket.position_after(bucket.start_floor) is None, "retention dropped the start"
    attached = await sync(c.admin.command, {"parallelChangeStream": 1, "name": "dropped", "bucket": 0})
    assert stream.replays == 1
    await sync(c.att.dropped.insert_many, [{"_id": i} for i in range(n, n + 20)])
    # The opener reads on too: a cursor that stops reading pins its bucket's retention.
    assert _ids(await sync(_read, c, opened["cursors"][0]["id"], 20)) == list(range(n, n + 20))
    events = await sync(_read, c, attached["cursor"]["id"], n + 20)
    assert _ids(events) == list(range(n + 20))
    await sync(_close_all)
