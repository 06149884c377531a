"""Exactly once across a proxy restart: a bucket resumed from a token returns every event after it
and none at or before it, whatever order the buckets re-attach in and however far apart their
tokens are.

The rule is the server's: a change stream resumed after a token starts with the first event that
sorts above it (mongo's src/mongo/db/pipeline/
document_source_change_stream_ensure_resume_token_present.cpp drops what sorts at or below the
client's token). Here each bucket is such a stream of its own namespaces, and the buckets share one
reading of the shards: the stream a restarted proxy opens for the first bucket to re-attach must
not hand a later-attaching bucket what it had already read.
"""

from __future__ import annotations

import time
from typing import Any

import bson
import pytest
import trio
from bson.raw_bson import RawBSONDocument

from buckets.bucketing import bucket_of
from tests.conftest import _close_all, client, proxy_uri, sync
from tests.integration.test_engine import NS, end_point, key
from wireproxy.app import serve_proxy
from wireproxy.config import ProxyConfig

# Two namespaces per bucket of a 2-bucket stream (crc32(ns) % 2), all hashed-sharded over the
# cluster's shards so that each bucket's events are merged from every shard.
NAMESPACES = {0: ["r.a", "r.b"], 1: ["r.d", "r.e"]}
PER_NS = 250  # phase 1: 500 events per bucket
BUCKET1_READ = 50  # bucket 1 stops here: its token is far older than bucket 0's
AFTER = 20  # phase 2: inserts per namespace after the restart
# Small bucket budgets: bucket 1's unread backlog fills its budget at once and stops the merge,
# so the restarted stream deals only a little past the older token before bucket 0 attaches.
BUCKET_BYTES = 64 << 10


def _write(c: Any, lo: int, hi: int) -> None:
    """Inserts _id lo..hi-1 into every namespace, interleaved in batches of 25."""
    for start in range(lo, hi, 25):
        for names in NAMESPACES.values():
            for ns in names:
                db, coll = ns.split(".")
                c[db][coll].insert_many([{"_id": i} for i in range(start, min(start + 25, hi))])


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


def _ids(events: list[RawBSONDocument]) -> list[tuple[str, int]]:
    return sorted((f"{e['ns']['db']}.{e['ns']['coll']}", e["documentKey"]["_id"]) for e in events)


def _expected(bucket: int, read: list[RawBSONDocument], hi: int) -> list[tuple[str, int]]:
    """The inserts of `bucket`'s namespaces below `hi` the bucket had not returned in `read`."""
    seen = set(_ids(read))
    return sorted((ns, i) for ns in NAMESPACES[bucket] for i in range(hi) if (ns, i) not in seen)


async def _phase1(cluster: Any) -> tuple[dict[int, Any], dict[int, list[RawBSONDocument]]]:
    """A first proxy: bucket 0 reads everything, bucket 1 its first events; their tokens."""
    tokens: dict[int, Any] = {}
    read: dict[int, list[RawBSONDocument]] = {}
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0))

        def run() -> None:
            c = client(proxy_uri(proxy))
            for names in NAMESPACES.values():
                for ns in names:
                    c.admin.command("shardCollection", ns, key={"_id": "hashed"})
            opened = c.admin.command({"parallelChangeStream": 1, "nBuckets": 2, "name": "once"})
            _write(c, 0, PER_NS)
            ids = {cur["bucket"]: cur["id"] for cur in opened["cursors"]}
            read[1] = _read(c, ids[1], BUCKET1_READ)
            read[0] = _read(c, ids[0], PER_NS * 2)
            for b in (0, 1):
                tokens[b] = bson.decode(read[b][-1]["_id"].raw)

        await sync(run)
        await sync(_close_all)
        nursery.cancel_scope.cancel()
    assert all(bucket_of(ns, 2) == b for b, names in NAMESPACES.items() for ns in names)
    assert key(tokens[1]) < key(tokens[0])
    return tokens, read


def _attach(c: Any, bucket: int, token: Any, field: str = "resumeAfter") -> int:
    reply = c.admin.command(
        {
            "parallelChangeStream": 1,
            "name": "once",
            "nBuckets": 2,
            "bucket": bucket,
            field: token,
            "bucketBufferBytes": BUCKET_BYTES,
        }
    )
    assert reply["cursor"]["firstBatch"] == []
    return int(reply["cursor"]["id"])


def _check(
    bucket: int, events: list[RawBSONDocument], token: Any, expected: list[tuple[str, int]]
) -> None:
    keys = [key(e["_id"]) for e in events]
    assert keys == sorted(set(keys)), f"bucket {bucket} repeated or reordered events"
    at_or_before = sum(k <= key(token) for k in keys)
    assert at_or_before == 0, (
        f"bucket {bucket} returned {at_or_before} events at or before its resume token"
    )
    assert _ids(events) == expected, f"bucket {bucket} lost or repeated events"


def _drain_and_check(
    c: Any,
    ids: dict[int, int],
    tokens: dict[int, Any],
    read: dict[int, list[RawBSONDocument]],
    hi: int,
) -> None:
    """Both buckets read in turns up to now (a bucket's backlog may hold the merge until it is
    read), each checked against the inserts below `hi` it had not returned before the restart."""
    end = end_point(c)
    got: dict[int, list[RawBSONDocument]] = {0: [], 1: []}
    done: set[int] = set()
    deadline = time.monotonic() + 60
    while len(done) < 2:
        assert time.monotonic() < deadline, f"buckets {sorted({0, 1} - done)} stalled"
        for b in sorted({0, 1} - done):
            r = c.admin.command(
                {"getMore": ids[b], "collection": NS, "maxTimeMS": 100},
                codec_options=bson.CodecOptions(document_class=RawBSONDocument),
            )
            got[b] += list(r["cursor"]["nextBatch"])
            if key(r["cursor"]["postBatchResumeToken"]) >= end:
                done.add(b)
    for b in (0, 1):
        _check(b, got[b], tokens[b], _expected(b, read[b], hi))


@pytest.mark.parametrize(
    "order", ["older first", "newer first", "older first, startAfter", "token list", "common token"]
)
async def test_a_restarted_proxy_resumes_each_bucket_exactly_after_its_token(cluster, order):
    """Bucket 0 read all its events, bucket 1 only its first: after a restart they re-attach in
    each order (each bucket alone, or all with a list of tokens, or both from bucket 1's older
    token): each returns exactly the events after its token, the new writes included."""
    tokens, read = await _phase1(cluster)
    if (
        order == "common token"
    ):  # bucket 0 re-reads from bucket 1's token, as a rewound consumer would
        tokens[0], read[0] = tokens[1], [e for e in read[0] if key(e["_id"]) <= key(tokens[1])]
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0))

        def run() -> None:
            c = client(proxy_uri(proxy))
            field = "startAfter" if "startAfter" in order else "resumeAfter"
            if order == "token list":
                opened = c.admin.command(
                    {
                        "parallelChangeStream": 1,
                        "name": "once",
                        "nBuckets": 2,
                        "resumeAfter": [tokens[0], tokens[1]],
                        "bucketBufferBytes": BUCKET_BYTES,
                    }
                )
                ids = {cur["bucket"]: cur["id"] for cur in opened["cursors"]}
            else:
                ids = {}
                for b in (1, 0) if order != "newer first" else (0, 1):
                    ids[b] = _attach(c, b, tokens[b], field)
            _write(c, PER_NS, PER_NS + AFTER)
            _drain_and_check(c, ids, tokens, read, PER_NS + AFTER)

        await sync(run)
        await sync(_close_all)
        nursery.cancel_scope.cancel()


async def test_a_bucket_resumed_from_a_replay_joins_its_named_stream(cluster):
    """Bucket 0 re-attaches first with its newer token, so bucket 1's older token is before what
    the restarted stream holds: bucket 1 is served by a replay of the oplogs, and the named
    stream's bucket 1 keeps what it is dealt for it meanwhile. Once the replay reaches that, the
    cursor moves to the named stream and the replay is closed: with many more events than the
    bucket budget holds, neither bucket stalls and each returns every event after its token once."""
    tokens, read = await _phase1(cluster)
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(serve_proxy, ProxyConfig(upstream=cluster.uri, listen_port=0))
        more = 8 * AFTER  # bucket 1's new events are several times its budget

        def run() -> None:
            c = client(proxy_uri(proxy))
            ids = {b: _attach(c, b, tokens[b]) for b in (0, 1)}
            engine = proxy.engine
            assert engine.cursors[ids[1]].stream is not engine.streams["once"], (
                "bucket 1 reads a replay"
            )
            _write(c, PER_NS, PER_NS + more)
            _drain_and_check(c, ids, tokens, read, PER_NS + more)
            assert engine.cursors[ids[1]].stream is engine.streams["once"]
            assert not engine.registry.private, "the replay stream was closed"

        await sync(run)
        await sync(_close_all)
        nursery.cancel_scope.cancel()
