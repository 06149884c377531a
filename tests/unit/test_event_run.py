"""The two kinds of event run (buckets/event_run.py) are one type to the engine: the same events
held as single events (a plain run) and as columns (a columnar run) give byte-identical replies,
the same bucket contents and the same shares, whatever the cuts between them."""

from __future__ import annotations

import functools
import uuid
from typing import Any

import bson
from bson import Binary, Int64, ObjectId, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from buckets._columnar.batch_splice import BATCH_MIN, splice_block
from buckets._columnar.event_block import EventBlock
from buckets._columnar.items import as_fields, as_runs, count_events, hold_blocks
from buckets._columnar.oplog_batch import OplogBatch
from buckets._columnar.run import ColumnarRun
from buckets.bucket import Bucket
from buckets.event_run import EventRun, PlainRun, fields_of
from buckets.reply import EventSizer, cursor_document, cut_reply
from mongoformats.wire import BATCH_ELEMENT_OVERHEAD

_UUIDS = [Binary(uuid.UUID(int=i).bytes, 4) for i in (1, 2, 3)]
_NS = [("db.c0",), ("db.c1",), ("db.c2",)]


def _runs(pads: list[int], collections: list[int]) -> tuple[ColumnarRun, PlainRun]:
    """A batch of inserts of documents padded by `pads` bytes, into collections `collections`,
    as a columnar run and as the plain run of the same events."""
    entries = []
    for inc, (pad, c) in enumerate(zip(pads, collections, strict=True), start=1):
        _id = ObjectId()
        entries.append(
            bson.encode(
                {
                    "op": "i",
                    "ns": f"db.c{c}",
                    "ui": _UUIDS[c],
                    "o": {"_id": _id, "pad": "x" * pad},
                    "o2": {"_id": _id},
                    "ts": Timestamp(100, inc),
                    "t": Int64(1),
                    "v": Int64(2),
                    "wall": bson.datetime_ms.DatetimeMS(100_000),
                }
            )
        )
    _, block, where = splice_block(OplogBatch.of(entries), expanded=False)
    assert block is not None and len(where) == len(entries)
    columnar = ColumnarRun(block)
    return columnar, PlainRun(columnar.fields())


@st.composite
def batches(draw: st.DrawFn) -> tuple[ColumnarRun, PlainRun, list[int]]:
    """A batch's two runs, and where to cut it into segments."""
    n = draw(st.integers(BATCH_MIN, BATCH_MIN + 30))
    pads = draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    collections = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=4)))
    return (*_runs(pads, collections), cuts)


def _segments(run: EventRun, cuts: list[int]) -> list[EventRun]:
    bounds = [0, *cuts, len(run)]
    return [run.sliced(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def _reply_bytes(runs: list[EventRun]) -> bytes:
    doc = cursor_document(7, "db.c", "nextBatch", runs, {"_data": "00"})
    return bson.encode({"cursor": doc, "ok": 1.0})


def _bucket(runs: list[EventRun], limit: int) -> Bucket:
    bucket = Bucket(0, limit, b"", {})
    for run in runs:
        bucket.put_nowait(run)
    return bucket


@settings(max_examples=30, deadline=None)
@given(batches(), st.data())
def test_plain_and_columnar_runs_give_the_same_replies_and_bucket_contents(
    batch: tuple[ColumnarRun, PlainRun, list[int]], data: st.DataObject
) -> None:
    columnar, plain, cuts = batch
    n = len(columnar)
    assert len(plain) == n and fields_of([columnar]) == plain.fields()
    buckets = [_bucket(_segments(run, cuts), 1 << 30) for run in (columnar, plain)]
    start = data.draw(st.integers(0, n - 1))
    limit = data.draw(st.integers(1, n + 2))
    replies = [
        cut_reply(bucket.items_from(start), limit, EventSizer(merged=True)) for bucket in buckets
    ]
    assert fields_of(replies[0]) == fields_of(replies[1])
    assert _reply_bytes(replies[0]) == _reply_bytes(replies[1])
    key = data.draw(st.sampled_from(plain.keys()))
    for probe in (key, key[:-1], key + b"\x00"):
        assert buckets[0].position_after(probe) == buckets[1].position_after(probe)
    assert buckets[0].keys_between(start, n) == buckets[1].keys_between(start, n)
    assert buckets[0].event_at(start) == buckets[1].event_at(start)
    assert [b.budget.used for b in buckets] == [columnar.nbytes] * 2


@settings(max_examples=30, deadline=None)
@given(batches(), st.data())
def test_plain_and_columnar_runs_measure_cut_and_share_alike(
    batch: tuple[ColumnarRun, PlainRun, list[int]], data: st.DataObject
) -> None:
    columnar, plain, _ = batch
    both: tuple[EventRun, EventRun] = (columnar, plain)
    total = columnar.nbytes
    room = data.draw(st.integers(0, total + 10))
    measure = data.draw(st.integers(0, 4000))
    answers = [
        (
            run.nbytes,
            run.first_key,
            run.last_key,
            run.keys(),
            run.last_token(),
            run.count_within(room),
            run.count_reaching(room),
            run.reply_prefix(room, BATCH_ELEMENT_OVERHEAD, measure),
            run.bisect_right(run.key(len(run) // 2)),
        )
        for run in both
    ]
    assert answers[0] == answers[1]
    routes = {ns: data.draw(st.sets(st.integers(0, 3), min_size=1)) for ns in _NS}

    def route(namespaces: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(sorted(routes[namespaces]))

    shares = [
        {b: (share.fields(), share.nbytes) for b, share in run.shares(route).items()}
        for run in both
    ]
    assert shares[0] == shares[1]
    assert all(shares[0][b][0] for b in shares[0]), "no empty share"


def test_retention_frees_the_same_events_from_either_run() -> None:
    """A full bucket drops what its cursors have passed alike, whichever run holds the events."""
    columnar, plain = _runs([500 * (i % 7) for i in range(BATCH_MIN + 10)], [0] * (BATCH_MIN + 10))
    held: list[tuple[int, int, list[Any]]] = []
    for run in (columnar, plain):
        bucket = _bucket(_segments(run, [3, 9]), run.nbytes)
        bucket.read_mark = len(run) // 2  # the events before it were read by a consumer gone
        bucket._drop_delivered(run.nbytes // 3)
        held.append((bucket.base, bucket.budget.used, bucket.keys_between(bucket.base, bucket.end)))
    assert held[0] == held[1] and held[0][0] > 0


def test_a_readers_items_become_runs_around_their_blocks_wherever_the_blocks_fall() -> None:
    """Blocks first, last, side by side or absent: each block is a columnar run, each stretch of
    single events between them one plain run (none empty), the events in order; the count and
    the holds go to the blocks alone."""
    columnar, plain = _runs([10] * 200, [i % 3 for i in range(200)])
    block, singles = columnar.block, plain.fields()
    for layout in ("", "B", "s", "Bs", "sB", "sBs", "BB", "sBBs", "BsBsB", "ssBsBBss"):
        items: list[Any] = []
        at = 0
        for kind in layout:
            if kind == "B":
                items.append(block.sliced(at, at + 40))
                at += 40
            else:
                items += singles[at : at + 3]
                at += 3
        runs = as_runs(items)
        assert fields_of(runs) == singles[:at] == as_fields(items)
        assert [type(r).__name__[0] for r in runs] == [
            "C" if k == "B" else "P" for k in layout.replace("ss", "s").replace("ss", "s")
        ]
        assert count_events(items) == at
        holds: list[int] = []
        hold_blocks(items, functools.partial(_recorded, holds))
        assert holds == [b.nbytes for b in items if isinstance(b, EventBlock)]
        assert [i.hold for i in items if isinstance(i, EventBlock)] == holds


def _recorded(holds: list[int], n: int) -> int:
    holds.append(n)
    return n
