"""bucketBy documentKey dealt as columns: the compiled loop gives each block event exactly the
bucket buckets_for_event gives it (buckets/bucketing.py's contract), and a Dealer gives each
bucket exactly the events, in the order, that the per-event path gives."""

from __future__ import annotations

import uuid
import zlib
from typing import Any

import bson
import numpy as np
import pyarrow as pa
import trio
from bson import Binary, Int64, ObjectId, Timestamp
from bson.datetime_ms import DatetimeMS
from hypothesis import given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from buckets._columnar.batch_splice import splice_block
from buckets._columnar.document_routes import _CRC
from buckets._columnar.event_block import EventBlock
from buckets._columnar.oplog_batch import OplogBatch
from buckets._columnar.run import ColumnarRun
from buckets.bucketing import buckets_for_event
from buckets.deal import Dealer
from buckets.event_run import EventRun, PlainRun, fields_of
from mongoformats.change_events import EventFields
from tests.unit.test_batch_splice import compound_ids, writes

# The `_id`s applications use (the ones a block holds): ObjectId, string, UUID, int and compound.
block_ids = st.one_of(
    st.binary(min_size=12, max_size=12).map(ObjectId),
    st.text(max_size=30),
    st.uuids().map(lambda u: Binary(u.bytes, 4)),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**61), 2**61).map(Int64),
    compound_ids,
)
# And the others: what the contract re-encodes (a symbol-free set of the types bson writes),
# old binary, other binary subtypes, doubles, dates, MinKey, regexes.
other_ids = st.one_of(
    st.binary(max_size=6).map(lambda b: Binary(b, 2)),
    st.binary(max_size=6).map(lambda b: Binary(b, 0)),
    st.floats(allow_nan=False),
    st.integers(0, 2**40).map(DatetimeMS),
    st.just(bson.MinKey()),
    st.text(st.characters(exclude_characters="\x00"), max_size=4).map(bson.Regex),
    st.booleans(),
    st.none(),
)
_NAMESPACES = [("db.c",), ("db.d",), ("other.long_collection_name",), ("db.a", "db.b"), ()]


def _entry(n: int, _id: Any, ns: str = "db.c", op: str = "i") -> bytes:
    o: dict[str, Any] = {"_id": _id, "a": n} if op == "i" else {"$v": 2, "diff": {"u": {"a": n}}}
    entry: dict[str, Any] = {"op": op, "ns": ns, "ui": Binary(b"u" * 16, 4), "o": o}
    if op == "d":
        entry["o"] = {"_id": _id}
    else:
        entry["o2"] = {"_id": _id}
    entry.update(ts=Timestamp(9, n + 1), t=Int64(1), v=Int64(2), wall=DatetimeMS(n))
    return bson.encode(entry)


def _blocks(entries: list[bytes]) -> list[EventBlock]:
    """The block the batch splice makes of `entries` (splice_block: splice_entries makes one
    of larger batches only), if any."""
    _, block, _ = splice_block(OplogBatch.of(entries), expanded=False)
    return [] if block is None else [block]


@st.composite
def events(draw: st.DrawFn) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A change event of any shape a block's bytes might hold (and some it never does): a
    documentKey of any `_id`, or none, or not a document, or twice, or with the shard key first;
    a fullDocument before it; of one namespace, of two, or of none."""
    _id = draw(block_ids | other_ids)
    key: Any = draw(
        st.sampled_from(["id", "id", "sharded", "none", "not a document", "twice", "no _id"])
    )
    event: dict[str, Any] = {"_id": {"_data": "00"}, "operationType": "insert"}
    event["clusterTime"] = Timestamp(1, 2)
    if draw(st.booleans()):
        event["fullDocument"] = {"_id": _id, "x": [1, "a", {"b": None}], "r": bson.Regex("a")}
    event["ns"] = {"db": "db", "coll": "c"}
    if key in ("id", "twice"):
        event["documentKey"] = {"_id": _id}
    elif key == "sharded":
        event["documentKey"] = {"k": draw(block_ids), "_id": _id}
    elif key == "not a document":
        event["documentKey"] = [_id]
    elif key == "no _id":
        event["documentKey"] = {"k": 1}
    raw = bson.encode(event)
    if key == "twice":  # a second documentKey element: the last one counts (bson_bytes.elements)
        tail = bson.encode({"documentKey": {"_id": draw(block_ids)}})
        raw = bson.encode(bson.decode(raw)) + b""
        body = raw[4:-1] + tail[4:-1]
        raw = (len(body) + 5).to_bytes(4, "little") + body + b"\0"
    return bson.decode(raw, bson.CodecOptions(document_class=dict)) | {"__raw": raw}, draw(
        st.sampled_from(_NAMESPACES)
    )


def _block_of(drawn: list[tuple[dict[str, Any], tuple[str, ...]]]) -> EventBlock:
    """A block of these events' bytes, a kind per namespaces (keys of one width, in order)."""
    raws = [event["__raw"] for event, _ in drawn]
    table = list(dict.fromkeys(namespaces for _, namespaces in drawn))
    kinds = np.array([table.index(namespaces) for _, namespaces in drawn], np.int32)
    keys = np.arange(len(raws), dtype=">u8").view(np.uint8).reshape(len(raws), 8)
    kind_table = tuple(("insert", "db", "c", namespaces, b"") for namespaces in table)
    return EventBlock(keys.copy(), pa.array(raws, pa.large_binary()), kinds, kind_table)


def _undecidable(ev: EventFields) -> bool:
    """Whether the per-event path may decide `ev`'s bucket (document_routes.py says when)."""
    raw = bytes(ev[5])
    try:
        key = bson.decode(raw, bson.CodecOptions(document_class=dict)).get("documentKey")
    except bson.errors.InvalidBSON:
        return True
    if len(ev[6]) != 1 or not isinstance(key, dict) or "_id" not in key:
        return True
    element = bson.encode({"_id": key["_id"]})[4]
    return element not in (0x07, 0x02, 0x10, 0x12, 0x03, 0x05) or (
        element == 0x05 and key["_id"].subtype == 2
    )


def _check_buckets(block: EventBlock, *, all_decided: bool) -> None:
    fields = block.fields()
    for n in range(1, 17):
        got = block.document_buckets(n).tolist()
        for bucket, ev in zip(got, fields, strict=True):
            if bucket == -1:
                assert not all_decided and _undecidable(ev)
            else:
                assert (bucket,) == buckets_for_event(ev, n, "documentKey")


def test_the_loops_crc_tables_are_zlibs() -> None:
    """The tables' CRC-32, a byte at a time (row 0) and 8 at a time (all rows), is zlib's."""
    data = bytes(range(256)) * 3 + b"tail"
    crc = 0x12345678 ^ 0xFFFFFFFF
    for byte in data:
        crc = int(_CRC[0, (crc ^ byte) & 255]) ^ (crc >> 8)
    assert crc ^ 0xFFFFFFFF == zlib.crc32(data, 0x12345678)
    crc = 0x12345678 ^ 0xFFFFFFFF
    for at in range(0, len(data) - 7, 8):
        crc ^= int.from_bytes(data[at : at + 4], "little")
        step = data[at + 4 : at + 8]
        crc = (
            _CRC[7, crc & 255]
            ^ _CRC[6, (crc >> 8) & 255]
            ^ _CRC[5, (crc >> 16) & 255]
            ^ _CRC[4, crc >> 24]
            ^ _CRC[3, step[0]]
            ^ _CRC[2, step[1]]
            ^ _CRC[1, step[2]]
            ^ _CRC[0, step[3]]
        )
    assert int(crc) ^ 0xFFFFFFFF == zlib.crc32(data[: len(data) // 8 * 8], 0x12345678)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("iud"), block_ids, st.sampled_from(["db.c", "db.d", "o.x"])),
        min_size=1,
        max_size=40,
    )
    | st.lists(writes(), min_size=1, max_size=40).map(
        lambda entries: [("raw", bson.encode(e), "") for e in entries]
    )
)
def test_a_spliced_blocks_buckets_are_buckets_for_events(
    drawn: list[tuple[str, Any, str]],
) -> None:
    """Real blocks (the batch splice's, of ObjectId, string, UUID, int and compound `_id`s, and
    of every write shape test_batch_splice draws): every event's bucket decided in the loop, and
    buckets_for_event's, for 1 to 16 buckets; also read through a merge of the block's halves."""
    entries = [e if op == "raw" else _entry(n, e, ns, op) for n, (op, e, ns) in enumerate(drawn)]
    for block in _blocks(entries):
        _check_buckets(block, all_decided=True)
        half = len(block) // 2
        if not half:
            continue
        _check_buckets(
            EventBlock.merge([block.sliced(half), block.sliced(0, half)]), all_decided=True
        )


@settings(max_examples=300, deadline=None)
@given(st.lists(events(), min_size=1, max_size=12))
def test_any_events_bucket_is_buckets_for_events_or_left_to_it(
    drawn: list[tuple[dict[str, Any], tuple[str, ...]]],
) -> None:
    """Events of any shape: the loop's bucket is buckets_for_event's, and -1 (left to the
    per-event path) only for an event of no single namespace, no documentKey document, no
    `_id`, or an `_id` the contract re-encodes (bucketing._COPIED_TYPES, old binary)."""
    _check_buckets(_block_of(drawn), all_decided=False)


def test_broken_bytes_are_left_to_the_per_event_path() -> None:
    good = bson.encode({"_id": 1, "documentKey": {"_id": 7}})
    cuts = [
        good[:-1] + b"\x01",  # no terminator
        good[:4] + b"\x0b" + good[5:],  # a regex's type byte: a type the loop does not size
        good.replace(b"\x03documentKey\x00\x0e", b"\x03documentKey\x00\x7f"),  # runs past the end
        good.replace(b"\x10_id\x00", b"\x10_id\x01"),  # a name that never ends
    ]
    block = _block_of([(bson.decode(good) | {"__raw": raw}, ("db.c",)) for raw in cuts])
    assert block.document_buckets(4).tolist() == [-1] * len(cuts)


class _Recorded:
    """A bucket that records what it is given."""

    def __init__(self) -> None:
        self.runs: list[EventRun] = []

    async def put_many(self, runs: list[EventRun]) -> None:
        self.runs += runs


def _dealt(ready: list[EventRun], n: int, kept: list[int]) -> dict[int, list[EventFields]]:
    buckets = {b: _Recorded() for b in kept}
    dealer = Dealer(buckets, n, scope=None, match=None, bucket_by="documentKey")  # type: ignore[arg-type]
    trio.run(dealer.deal, ready, clock=MockClock(autojump_threshold=0))
    return {b: fields_of(bucket.runs) for b, bucket in buckets.items()}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("iud"), block_ids), min_size=1, max_size=60),
    st.lists(events(), min_size=1, max_size=8),
    st.integers(1, 16),
    st.randoms(),
)
def test_dealing_by_document_key_gives_each_bucket_the_per_event_paths_events_in_order(
    writes: list[tuple[str, Any]],
    odd: list[tuple[dict[str, Any], tuple[str, ...]]],
    n: int,
    rnd: Any,
) -> None:
    """A release of blocks (a spliced one, and one of events the loop leaves to the per-event
    path: barriers without a documentKey, old binary `_id`s) between single events, dealt to
    some kept buckets: each bucket gets the events, in the order, that dealing the same events
    as single events gives it, and that buckets_for_event gives it event by event."""
    spliced = _blocks([_entry(i, _id, "db.c", op) for i, (op, _id) in enumerate(writes)])
    odd_block = _block_of(odd)
    singles = odd_block.fields()
    ready: list[EventRun] = [ColumnarRun(b) for b in spliced]
    cut = rnd.randint(0, len(singles))
    ready = [PlainRun(singles[:cut]), *ready, ColumnarRun(odd_block), PlainRun(singles[cut:])]
    ready = [run for run in ready if len(run)]
    kept = sorted(rnd.sample(range(n), rnd.randint(1, n)))
    plain: list[EventRun] = [PlainRun(run.fields()) for run in ready]
    one_by_one = {  # the per-event path: each event to its buckets_for_event, in order
        b: [ev for ev in fields_of(ready) if b in buckets_for_event(ev, n, "documentKey")]
        for b in kept
    }
    assert _dealt(ready, n, kept) == _dealt(plain, n, kept) == one_by_one


def test_a_uuid_block_deals_whole_to_one_bucket_and_in_parts_to_many() -> None:
    ids = [Binary(uuid.UUID(int=i).bytes, 4) for i in range(64)]
    (block,) = _blocks([_entry(i, _id) for i, _id in enumerate(ids)])
    run = ColumnarRun(block)
    whole = run.document_shares(1, [0], lambda ev: buckets_for_event(ev, 1, "documentKey"))
    assert list(whole) == [0] and whole[0].block is block  # type: ignore[attr-defined]
    parts = run.document_shares(8, range(8), lambda ev: buckets_for_event(ev, 8, "documentKey"))
    assert sum(map(len, parts.values())) == 64 and len(parts) > 1
