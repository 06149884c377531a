"""A bucket whose consumer is slow or gone falls behind instead of stopping the merge for every
bucket, and its consumer catches up later from a replay of the oplogs (buckets/catch_up.py).

Each test writes a backlog of several bucket budgets to a 2-bucket stream whose bucket 1 is not
read while bucket 0 is: bucket 0 gets every event, the stream stays within its budgets, and bucket
1, read afterwards, returns every one of its events exactly once and in write order (identified
by namespace and _id against the documents written), then goes on live."""

from __future__ import annotations

from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument

from buckets.metrics import EngineCollector
from mongoformats.resume_token import token_sort_key
from tests.conftest import _close_all, client, proxy_uri, sync
from tests.integration.test_attach import _one_namespace_per_bucket

NS = "$cmd.parallelChangeStream"
BUDGET = 256 << 10
PAD = "x" * 1000
CHUNK = 50


def _get_more(c: Any, cid: int, n: int, wait_ms: int = 300) -> list[RawBSONDocument]:
    r = c.admin.command(
        {"getMore": cid, "collection": NS, "batchSize": n, "maxTimeMS": wait_ms},
        codec_options=bson.CodecOptions(document_class=RawBSONDocument),
    )
    return list(r["cursor"]["nextBatch"])


def _key(e: RawBSONDocument) -> tuple[str, int]:
    return f"{e['ns']['db']}.{e['ns']['coll']}", e["documentKey"]["_id"]


class Workload:
    """Inserts of padded documents, in chunks; every third chunk in a transaction. With
    `bucket_by` "namespace" one collection per bucket, with "documentKey" one collection."""

    def __init__(self, c: Any, bucket_by: str) -> None:
        self.c = c
        self.names = (
            list(_one_namespace_per_bucket(2).values()) if bucket_by == "namespace" else ["fb.hot"]
        )
        self.written: list[tuple[str, int]] = []  # in write order
        self.chunks = 0

    def write(self, n: int) -> None:
        c, lo = self.c, len(self.written) // len(self.names)
        for start in range(lo, lo + n, CHUNK):
            ids = range(start, min(start + CHUNK, lo + n))
            self.chunks += 1
            if self.chunks % 3 == 0:
                with c.start_session() as s:
                    s.with_transaction(
                        lambda s, ids=ids: [
                            c[ns.split(".")[0]][ns.split(".")[1]].insert_many(
                                [{"_id": i, "pad": PAD} for i in ids], session=s
                            )
                            for ns in self.names
                        ]
                    )
            else:
                for ns in self.names:
                    db, coll = ns.split(".")
                    c[db][coll].insert_many([{"_id": i, "pad": PAD} for i in ids])
            # A transaction's events come in its applyOps order: namespace by namespace.
            self.written += [(ns, i) for ns in self.names for i in ids]


def _open(c: Any, name: str, bucket_by: str) -> tuple[int, int]:
    opened = c.admin.command(
        {
            "parallelChangeStream": 1,
            "nBuckets": 2,
            "name": name,
            "bucketBufferBytes": BUDGET,
            "bucketBy": bucket_by,
        }
    )
    cursors = {cur["bucket"]: cur["id"] for cur in opened["cursors"]}
    return cursors[0], cursors[1]


def _bucket_status(c: Any, name: str, i: int) -> dict[str, Any]:
    status = c.admin.command({"parallelChangeStreamStatus": 1, "name": name})
    return status["streams"][0]["buckets"][i]


def _read_until(c: Any, cid: int, got: list[RawBSONDocument], n: int, check: Any = None) -> None:
    while len(got) < n:
        got += _get_more(c, cid, n - len(got))
        if check is not None:
            check()


@pytest.mark.parametrize("bucket_by", ["namespace", "documentKey"])
async def test_a_stalled_bucket_falls_behind_and_catches_up(cluster, proxy, bucket_by):
    """Bucket 1's cursor is never read while 8 budgets per bucket are written and bucket 0 is
    read: bucket 0 gets all of its events, every budget stays within its limit, and the status
    says bucket 1 is behind with events dropped. Bucket 1 is then read: all of its events, in
    order, each once, then the events written after, from the stream again (live)."""
    name = f"stall-{bucket_by}"
    c = client(proxy_uri(proxy))
    b0, b1 = await sync(_open, c, name, bucket_by)
    work = Workload(c, bucket_by)
    await sync(work.write, 8 * BUDGET // 1000 // len(work.names) * 2)
    stream = proxy.engine.streams[name]
    bucket_budgets = sum(b.budget.limit for b in stream.buckets.values())
    shard_budgets = sum(b.limit for b in stream.shard_budgets.values())
    held: list[int] = []

    def within_budgets() -> None:
        for b in stream.buckets.values():
            assert b.budget.used <= b.budget.limit, "a bucket over its budget"
        held.append(stream.memory()["heldBytes"])

    got0: list[RawBSONDocument] = []

    def drain0() -> None:
        # Until bucket 0 is idle: every event it will ever get has come.
        while True:
            more = _get_more(c, b0, 1000)
            within_budgets()
            if (
                not more
                and stream.buckets[1].lag.behind
                and stream.events_merged >= len(work.written)
            ):
                break
            got0.extend(more)

    await sync(drain0)
    assert max(held) <= bucket_budgets + shard_budgets
    status = await sync(_bucket_status, c, name, 1)
    assert status["state"] == "behind" and status["droppedEvents"] > 0, status
    assert (await sync(_bucket_status, c, name, 0))["state"] == "live"
    mine0 = [k for k in work.written if _in(k, 0, stream)]
    mine1 = [k for k in work.written if _in(k, 1, stream)]
    assert [_key(e) for e in got0] == mine0, "bucket 0: every event once, in order"
    assert len(mine1) > 4 * BUDGET // 1000, "bucket 1 has a backlog of budgets"

    got1: list[RawBSONDocument] = []
    await sync(_read_until, c, b1, got1, len(mine1))
    assert [_key(e) for e in got1] == mine1, "bucket 1: every event once, in order"
    assert stream.replays >= 1
    # Live again: events written now come from the stream's own bucket once the replay meets it.
    await sync(work.write, CHUNK)
    new = work.written[-CHUNK * len(work.names) :]
    await sync(_read_until, c, b0, got0, len(mine0) + len([k for k in new if _in(k, 0, stream)]))
    tail1 = [k for k in new if _in(k, 1, stream)]
    more1: list[RawBSONDocument] = []
    await sync(_read_until, c, b1, more1, len(tail1))
    assert [_key(e) for e in more1] == tail1
    await sync(_back_live, c, proxy, name, b1)
    await sync(_close_all)


def _back_live(c: Any, proxy: Any, name: str, cid: int) -> None:
    """Read the idle cursor `cid` (of bucket 1) until it is back on its stream, and the stream's
    bucket live again."""
    stream = proxy.engine.streams[name]
    for _ in range(100):
        if (
            proxy.engine.cursors[cid].stream is stream
            and _bucket_status(c, name, 1)["state"] == "live"
        ):
            return
        assert not _get_more(c, cid, 10), "nothing more was written"
    raise AssertionError("bucket 1's cursor never came back to its stream")


def _in(key: tuple[str, int], bucket: int, stream: Any) -> bool:
    """Whether the insert `key` goes to `bucket` of `stream` (its routing)."""
    from buckets.bucketing import bucket_of, bucket_of_document

    ns, _id = key
    if stream.options.bucket_by == "namespace":
        return bucket_of(ns, stream.options.n_buckets) == bucket
    return bucket_of_document(ns, _id, stream.options.n_buckets) == bucket


def _read_0_until_1_is_behind(
    c: Any, b0: int, stream: Any, work: Workload, got0: list[RawBSONDocument]
) -> None:
    """Read bucket 0 into `got0` until bucket 1 has fallen behind and every write is merged."""
    while not (stream.buckets[1].lag.behind and stream.events_merged >= len(work.written)):
        got0.extend(_get_more(c, b0, 1000))


async def _bucket_1_fallen_behind(
    proxy: Any, name: str
) -> tuple[Any, int, int, Any, Any, list[RawBSONDocument]]:
    """A 2-bucket stream `name` by namespace, 4 budgets written; bucket 0 read until bucket 1,
    never read, has fallen behind and every write is merged: (client, bucket 0's and bucket 1's
    cursor ids, the workload, the engine's stream, bucket 0's events so far)."""
    c = client(proxy_uri(proxy))
    b0, b1 = await sync(_open, c, name, "namespace")
    work = Workload(c, "namespace")
    await sync(work.write, 4 * BUDGET // 1000)
    stream = proxy.engine.streams[name]
    got0: list[RawBSONDocument] = []

    await sync(_read_0_until_1_is_behind, c, b0, stream, work, got0)
    return c, b0, b1, work, stream, got0


async def test_writes_go_on_while_a_stalled_bucket_catches_up(cluster, proxy):
    """Bucket 1 falls behind while bucket 0 is read; then both are read side by side while
    writes go on: bucket 1 reports catching up (reading a replay), returns every event once
    and in order, including those written during its catch-up, and comes back to its stream."""
    name = "stall-writes"
    c, b0, b1, work, stream, got0 = await _bucket_1_fallen_behind(proxy, name)
    got: dict[int, list[RawBSONDocument]] = {0: got0, 1: []}
    states: list[str] = []

    def side_by_side() -> None:
        for _ in range(8):  # a chunk of writes per round: the catch-up chases a moving end
            work.write(CHUNK)
            for b, cid in ((0, b0), (1, b1)):
                got[b].extend(_get_more(c, cid, 200))
            states.append(_bucket_status(c, name, 1)["state"])
        for b, cid in ((0, b0), (1, b1)):
            mine = [k for k in work.written if _in(k, b, stream)]
            _read_until(c, cid, got[b], len(mine))

    await sync(side_by_side)
    for b in (0, 1):
        assert [_key(e) for e in got[b]] == [k for k in work.written if _in(k, b, stream)], b
    assert "catchingUp" in states, states
    status = await sync(_bucket_status, c, name, 1)
    assert status["fellBehind"] >= 1 and status["droppedTotal"] > 0
    metrics = {m.name: m for m in await EngineCollector(proxy.engine).snapshot()}
    dropped = {
        s.labels["bucket"]: s.value
        for s in metrics["pcs_bucket_dropped"].samples
        if s.labels["stream"] == name and s.name.endswith("_total")
    }
    assert dropped["1"] == status["droppedTotal"] and dropped["0"] == 0
    assert "pcs_bucket_behind_seconds" in metrics
    await sync(_back_live, c, proxy, name, b1)
    await sync(_close_all)


async def test_a_split_event_in_a_stalled_bucket_comes_back_in_its_fragments(cluster, proxy):
    """With $changeStreamSplitLargeEvent: an update of about 20 MiB (a 10 MiB pre-image beside a
    10 MiB change) in the middle of bucket 1's backlog, while bucket 1 is not read and falls
    behind: read afterwards, bucket 1 returns its inserts and the event's two fragments, each
    once and in order (the re-read serves the event that a 256 KiB bucket never held)."""
    name = "stall-split"
    c = client(proxy_uri(proxy))
    names = _one_namespace_per_bucket(2)
    ns0, ns1 = names[0], names[1]
    db1, coll1 = ns1.split(".")
    big = "q" * (10 << 20)

    def setup() -> tuple[int, int]:
        c[db1].create_collection(coll1, changeStreamPreAndPostImages={"enabled": True})
        c[db1][coll1].insert_one({"_id": -1, "value": big})
        opened = c.admin.command(
            {
                "parallelChangeStream": 1,
                "nBuckets": 2,
                "name": name,
                "bucketBufferBytes": BUDGET,
                "pipeline": [{"$changeStreamSplitLargeEvent": {}}],
                "fullDocumentBeforeChange": "whenAvailable",
            }
        )
        cursors = {cur["bucket"]: cur["id"] for cur in opened["cursors"]}
        return cursors[0], cursors[1]

    b0, b1 = await sync(setup)
    n = 1000  # about 4 budgets of events, in whole chunks

    def write() -> None:
        for lo in range(0, n, CHUNK):
            if lo == n // 2:
                c[db1][coll1].update_one({"_id": -1}, {"$set": {"value": "z" * (10 << 20)}})
            for ns in (ns0, ns1):
                db, coll = ns.split(".")
                c[db][coll].insert_many([{"_id": i, "pad": PAD} for i in range(lo, lo + CHUNK)])

    await sync(write)
    stream = proxy.engine.streams[name]
    got0: list[RawBSONDocument] = []

    def drain0() -> None:
        while not (stream.buckets[1].lag.behind and len(got0) >= n):
            got0.extend(_get_more(c, b0, 1000))

    await sync(drain0)
    assert [e["documentKey"]["_id"] for e in got0] == list(range(n))
    got1: list[RawBSONDocument] = []
    await sync(_read_until, c, b1, got1, n + 2)

    def seen(e: RawBSONDocument) -> tuple[str, int | None, int | None]:
        split = e.get("splitEvent")
        key = e.get("documentKey")
        kind = e.get("operationType")
        return kind, key["_id"] if key else None, split["fragment"] if split else None

    expected = [("insert", i, None) for i in range(n // 2)]
    expected += [("update", -1, 1), (None, None, 2)]  # the second holds the rest of the fields
    expected += [("insert", i, None) for i in range(n // 2, n)]
    assert [seen(e) for e in got1] == expected
    assert not await sync(_get_more, c, b1, 10), "nothing twice"
    await sync(_close_all)


async def test_reopening_with_a_token_in_a_fallen_behind_buckets_gap_replays_it(cluster, proxy):
    """A whole-stream open with one token per bucket, bucket 1's after the point it is complete
    to (in what it dropped): the cursor is served by a replay from that token, returning exactly
    bucket 1's events after it, which the bucket alone could not serve."""
    name = "stall-reopen"
    c, b0, b1, work, stream, got0 = await _bucket_1_fallen_behind(proxy, name)
    mid = got0[-len(got0) // 4]["_id"]
    assert stream.buckets[1].position_after(token_sort_key(mid)) is None, "in bucket 1's gap"
    reopened = await sync(
        c.admin.command,
        {
            "parallelChangeStream": 1,
            "nBuckets": 2,
            "name": name,
            "resumeAfter": [got0[-1]["_id"], mid],
        },
    )
    again = {cur["bucket"]: cur["id"] for cur in reopened["cursors"]}
    mine1 = [k for k in work.written if _in(k, 1, stream)]
    everything: list[RawBSONDocument] = []
    await sync(_read_until, c, b1, everything, len(mine1))
    after = [e for e in everything if e["_id"]["_data"] > mid["_data"]]
    assert 0 < len(after) < len(everything)
    got: list[RawBSONDocument] = []
    await sync(_read_until, c, again[1], got, len(after))
    assert [e["_id"]["_data"] for e in got] == [e["_id"]["_data"] for e in after]
    await sync(_close_all)


async def test_a_bucket_that_falls_behind_again_and_again_loses_and_repeats_nothing(cluster, proxy):
    """Three rounds: bucket 1's consumer stays away while several budgets are written and bucket
    0 is read, so bucket 1 falls behind; then it reads until it is back on its live bucket. Over
    the rounds each bucket returns every event once, in write order, with resume tokens rising,
    across three falls, three replays and three rejoins."""
    name = "stall-rounds"
    c = client(proxy_uri(proxy))
    b0, b1 = await sync(_open, c, name, "namespace")
    work = Workload(c, "namespace")
    stream = proxy.engine.streams[name]
    got: dict[int, list[RawBSONDocument]] = {0: [], 1: []}

    def round_() -> None:
        work.write(4 * BUDGET // 1000)
        _read_0_until_1_is_behind(c, b0, stream, work, got[0])
        _read_until(c, b1, got[1], len([k for k in work.written if _in(k, 1, stream)]))
        _back_live(c, proxy, name, b1)

    for _ in range(3):
        await sync(round_)
    await sync(_read_until, c, b0, got[0], len([k for k in work.written if _in(k, 0, stream)]))
    for b in (0, 1):
        assert [_key(e) for e in got[b]] == [k for k in work.written if _in(k, b, stream)], b
        tokens = [e["_id"]["_data"] for e in got[b]]
        assert tokens == sorted(set(tokens)), f"bucket {b}: resume tokens rise, none twice"
    status = await sync(_bucket_status, c, name, 1)
    assert status["fellBehind"] == 3 and stream.replays >= 3, status
    await sync(_close_all)
