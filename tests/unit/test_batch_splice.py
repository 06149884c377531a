"""The batch splice gives, for every entry it takes, exactly the event `splice_crud` gives.

`splice_crud` is pinned to the general transform by test_oplog_splice; these tests pin the numpy
batch path to `splice_crud` byte for byte, on random batches, on broken bytes, and on the entries
a real workload writes (retryable writes included).
"""

from __future__ import annotations

import pickle
import uuid
from typing import Any
from unittest import mock

import bson
from bson import Binary, Int64, ObjectId, Timestamp
from bson.codec_options import CodecOptions
from bson.datetime_ms import DatetimeMS
from bson.raw_bson import RawBSONDocument
from hypothesis import given, settings
from hypothesis import strategies as st

from buckets._columnar.batch_splice import BATCH_MIN, splice_block, splice_entries
from buckets._columnar.event_block import EventBlock
from buckets._columnar.items import as_fields
from buckets._columnar.oplog_batch import OplogBatch
from buckets._columnar.run import ColumnarRun
from mongoformats.diff_splice import update_description
from mongoformats.keystring import KeyStringBuilder, encode_type_bits
from mongoformats.oplog_splice import splice_crud
from tests.unit.test_oplog_splice import crud_entries


@st.composite
def writes(draw: st.DrawFn) -> dict[str, Any]:
    """A plain insert, update, replacement or delete as a server writes it, a retryable write's
    or not, in a collection with events or not (internal, a view's), and now and then an entry
    of another shape."""
    if draw(st.integers(0, 9)) == 0:
        return draw(crud_entries())
    _id = draw(ids)
    # Names alike in length and a UUID shared (a rename's before and after): kinds told apart by
    # their bytes.
    ns = draw(
        st.sampled_from(
            [
                "db.c",
                "db.c",
                "db.d",
                "other.long_collection_name",
                "admin.x",
                "db.system.views",
                "db." + "n" * 100,
            ]
        )
    )
    ui = Binary(uuid.UUID(int=draw(st.one_of(st.just(7), st.integers(0, 2**128 - 1)))).bytes, 4)
    value = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=20))
    doc = draw(st.dictionaries(st.sampled_from("abc"), value, max_size=3))
    entry: dict[str, Any] = {
        "op": "i",
        "ns": ns,
        "ui": ui,
        "o": {"_id": _id, **doc},
        "o2": {"_id": _id},
    }
    op = draw(st.sampled_from("idur"))
    if op == "d":
        entry = {"op": "d", "ns": ns, "ui": ui, "o": {"_id": _id}}
    elif op == "r":
        entry = {**entry, "op": "u", "o": draw(replacements(_id, doc))}
    elif (
        op == "u"
    ):  # the usual diffs (top-level sections), and now and then one splice_crud makes otherwise
        entry = {
            "op": "u",
            "ns": ns,
            "ui": ui,
            "o": {"$v": 2, "diff": draw(update_diffs)},
            "o2": {"_id": _id},
        }
    retryable = draw(st.booleans())
    if retryable:
        entry["stmtId"] = draw(st.integers(0, 5))
    entry["ts"] = Timestamp(draw(st.integers(1, 2**32 - 1)), draw(st.integers(0, 2**32 - 1)))
    entry["t"], entry["v"] = Int64(1), Int64(2)
    entry["wall"] = bson.datetime_ms.DatetimeMS(draw(st.integers(0, 2**41)))
    if retryable:
        session = {
            "lsid": {"id": Binary(uuid.uuid4().bytes, 4), "uid": b"\x01" * 32},
            "txnNumber": Int64(draw(st.integers(0, 9))),
        }
        entry = {**session, **entry, "prevOpTime": {"ts": Timestamp(0, 0), "t": Int64(-1)}}
    return entry


# Values of compound `_id`s: those the block walks (int32, int64, string, ObjectId, documents of
# these) and those it leaves to splice_crud (int64s of 2**62 or more, doubles, booleans).
_key_values = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([0, -1, 1, 127, 128, -128, -129, 2**31 - 1, -(2**31)]),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.sampled_from([2**62 - 1, -(2**62) + 1, 2**62, -(2**62), 2**53 + 1, 2**63 - 1]).map(Int64),
    st.text(alphabet="\x00a\xe9", max_size=8),
    st.binary(min_size=12, max_size=12).map(ObjectId),
)
_other_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(Int64), st.floats(allow_nan=False), st.booleans()
)
compound_ids = st.one_of(
    st.fixed_dictionaries({"store": st.integers(0, 99), "sku": st.text(max_size=12)}),
    st.recursive(
        st.dictionaries(st.sampled_from(["a", "b", "store", "sku"]), _key_values, max_size=3),
        lambda inner: st.dictionaries(st.sampled_from(["x", "y"]), inner | _key_values, max_size=2),
        max_leaves=6,
    ),
    st.dictionaries(st.sampled_from(["a", "b"]), _key_values | _other_values, max_size=3),
)

# The `_id` kinds applications use: ObjectId, string (NULs, empty, non-ASCII, long: a KeyString
# over 127 bytes), UUID, int32 and compound ids of int32s, strings and ObjectIds (the block's),
# and int64, other binary and other compound ids (spliced from the block's layout, one by one).
ids = st.one_of(
    st.binary(min_size=12, max_size=12).map(ObjectId),
    st.text(max_size=30),
    st.text(alphabet="\x00a\xe9\u20ac\U0001d11e", max_size=6),
    st.text(alphabet="\x00ab", min_size=128, max_size=300),
    st.uuids().map(lambda u: Binary(u.bytes, 4)),
    st.binary(min_size=16, max_size=16).map(lambda b: Binary(b, 3)),
    st.binary(min_size=1, max_size=20).map(lambda b: Binary(b, 0)),
    compound_ids,
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**31), 2**31 - 1),
)

_fields = st.dictionaries(
    st.sampled_from(["a", "b", "long_field_name"]),
    st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.text(max_size=20),
        st.lists(st.integers(-9, 9), max_size=3),
        st.dictionaries(st.just("x"), st.booleans()),
    ),
    min_size=1,
    max_size=3,
)
_new_fields = _fields.map(lambda f: {k + "2": v for k, v in f.items()})
# The diffs the block reads itself: top-level `u` and `i` sections alone, in either order (a
# `$set` of existing and new fields, an `$inc` of a missing one), empty ones too.
top_level_diffs = st.one_of(
    st.fixed_dictionaries({"u": _fields}),
    st.fixed_dictionaries({"i": _new_fields}),
    st.tuples(_fields, _new_fields).map(lambda t: {"u": t[0], "i": t[1]}),
    st.tuples(_fields, _new_fields).map(lambda t: {"i": t[1], "u": t[0]}),
    st.sampled_from([{"u": {}}, {"i": {}}, {"u": {}, "i": {}}, {"i": {}, "u": {"a": 1}}]),
)
update_diffs = st.one_of(
    top_level_diffs,
    st.fixed_dictionaries(
        {},
        optional={
            "d": st.dictionaries(st.sampled_from(["x", "y"]), st.just(False), min_size=1),
            "u": _fields,
            "i": _new_fields,
        },
    ),
    st.fixed_dictionaries({"u": _fields, "sa": st.fixed_dictionaries({"u": _fields})}),
    # An array's diff: a `$push` (u<index>), an element's sub-diff (`items.0.qty`), a truncation.
    st.fixed_dictionaries(
        {
            "i": _fields,
            "sarr": st.fixed_dictionaries(
                {"a": st.just(True)},
                optional={
                    "l": st.integers(0, 3),
                    "u2": _fields,
                    "s0": st.fixed_dictionaries({"u": _fields}),
                },
            ),
        }
    ),
)


@st.composite
def replacements(draw: st.DrawFn, _id: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """A replacement's `o`, the new document: as a server writes it, its `_id` first (nested
    documents, arrays, up to a few KB), and now and then one splice_crud judges otherwise than
    by its first bytes (a `$v` field, the bytes `$v\0` in a value, `_id` not first or missing)."""
    if draw(st.integers(0, 3)):
        extra = draw(
            st.fixed_dictionaries({}, optional={"pad": st.text("xy\u20ac", max_size=2000)})
        )
        nested = draw(st.fixed_dictionaries({}, optional={"sub": st.just({"x": [1, {"y": "z"}]})}))
        return {"_id": _id, **doc, **nested, **extra}
    return draw(
        st.sampled_from(
            [
                {"_id": _id, "$v": 2, **doc},
                {"_id": _id, "a": {"$v": 1}},
                {"_id": _id, "s": "$v"},
                {"_id": _id, "$v2": 1, **doc},
                {**doc, "_id": _id},
                {"$v": 2, "_id": _id},
                {"$v": 1, "diff": {"u": {"a": 1}}},
                {"_id": _id, "diff": {"u": {"a": 1}}},
                {},
                doc,
            ]
        )
    )


def _replacement_read(o: dict[str, Any]) -> bool:
    """Whether an update's `o` is a replacement the block reads: a document led by its `_id`
    that holds the bytes `$v\0` nowhere (splice_crud's `_diff_at` tells those without a walk)."""
    return list(o)[:1] == ["_id"] and b"$v\x00" not in bson.encode(o)


_IDL_ORDER = [
    "lsid",
    "txnNumber",
    "op",
    "ns",
    "ui",
    "o",
    "o2",
    "stmtId",
    "ts",
    "t",
    "v",
    "wall",
    "prevOpTime",
]


def _walked(value: Any) -> bool:
    """Whether a documentKey's value is one the block walks (id_keys.py): an int32, an int64 of a
    magnitude below 2**62, a string, an ObjectId, or a document of these."""
    if isinstance(value, dict):
        return all(map(_walked, value.values()))
    if isinstance(value, int) and not isinstance(value, bool):  # an int64 if not an int32's
        return abs(value) < 2**62 or (type(value) is int and -(2**31) <= value < 2**31)
    return type(value) in (ObjectId, str)  # (not Code, a str of another BSON type)


def _taken_key(key: Any) -> bool:
    """Whether a documentKey is one the block takes: `{_id}` alone of a binary of 16 bytes, or any
    documentKey of walked values."""
    _id = key.get("_id")
    return (list(key) == ["_id"] and isinstance(_id, bytes) and len(_id) == 16) or _walked(key)


def _same_as_one_by_one(entries: list[bytes], expanded: bool) -> tuple[list[Any], set[int]]:
    """Each entry's event as the batch splice gives it (its block's events in their entries'
    places), checked against splice_crud's, None where the batch leaves the entry to it; and
    the entries its block holds."""
    out, block, where = splice_block(OplogBatch.of(entries), expanded=expanded)
    assert len(out) == len(entries) and all(out[i] is None for i in where)
    batch = list(out)
    if block is not None:  # (also after a trip between processes)
        assert block.fields() == pickle.loads(pickle.dumps(block)).fields()
        for i, fields in zip(where, block.fields(), strict=True):
            batch[i] = fields
    # The block's events are its entries' (a documentKey the block takes each); the others
    # spliced here are of entries with another documentKey (where a broken entry's event still
    # reads).
    assert set(where.tolist()) <= {i for i, item in enumerate(batch) if item}
    for item in out:
        if item:
            try:
                key = bson.decode(item[5])["documentKey"]
            except (bson.errors.BSONError, KeyError):
                continue
            assert not _taken_key(key)
    for raw, item in zip(entries, batch, strict=True):
        if item is not None:
            assert item == splice_crud(raw, expanded=expanded)
    return batch, set(where.tolist())


def _diff_read(o: dict[str, Any]) -> bool:
    """Whether an update's `o` is a `$v: 2` diff the byte path reads. A server never writes the
    others (an array index with a leading zero, one path twice), which go the general way."""
    if list(o) != ["$v", "diff"] or o["$v"] != 2 or not isinstance(o["diff"], dict):
        return False
    raw = bson.encode(o)
    return update_description(raw, raw.index(b"\x03diff\x00") + 6, expanded=False) is not None


@settings(max_examples=300, deadline=None)
@given(st.lists(writes(), min_size=1, max_size=40), st.booleans())
def test_a_batch_splices_every_insert_update_and_delete_as_splice_crud_does(
    entries: list[dict[str, Any]], expanded: bool
) -> None:
    raws = [bson.encode(e) for e in entries]
    batch, in_block = _same_as_one_by_one(raws, expanded)
    for i, (entry, item) in enumerate(zip(entries, batch, strict=True)):
        key = entry.get("o2") if entry["op"] in "iu" else entry["o"] if entry["op"] == "d" else None
        plain = (
            key is not None
            and list(key) == ["_id"]
            and key["_id"] == entry["o"].get("_id", key["_id"])
            and "ui" in entry
            and "wall" in entry
            and not entry["ns"].endswith(".views")
            and not (
                entry["op"] == "u"
                and not _replacement_read(entry["o"])
                and (expanded or not _diff_read(entry["o"]))
            )
        )
        if plain and list(entry) == sorted(
            entry, key=_IDL_ORDER.index
        ):  # as a server writes it: always taken, into the block if it takes its key
            assert item is not None
            internal = entry["ns"].startswith("admin.")
            assert (i in in_block) == (_taken_key(key) and not internal)


@settings(max_examples=300, deadline=None)
@given(st.lists(writes(), min_size=1, max_size=8), st.data())
def test_broken_bytes_are_left_to_the_one_by_one_path(
    entries: list[dict[str, Any]], data: st.DataObject
) -> None:
    """A byte changed, or an entry cut short, anywhere: what is taken is still exactly splice_crud's
    event (a changed document byte is copied, as splice_crud copies it), and nothing raises: an
    entry it cannot read is left to splice_crud, which says what is wrong with it."""
    raws = [bytearray(bson.encode(e)) for e in entries]
    for _ in range(data.draw(st.integers(1, 4))):
        raw = raws[data.draw(st.integers(0, len(raws) - 1))]
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(raws) - 1))
        raws[i] = raws[i][: data.draw(st.integers(0, len(raws[i])))]
    _same_as_one_by_one([bytes(r) for r in raws], data.draw(st.booleans()))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(top_level_diffs, ids, st.booleans()), min_size=1, max_size=20))
def test_updates_of_u_and_i_sections_alone_are_made_in_the_block(
    updates: list[tuple[dict[str, Any], Any, bool]],
) -> None:
    """An update whose diff is top-level `u` and/or `i` documents alone, in either order, has its
    updateDescription written by the block's kernels (none is made one by one in Python), and its
    event is splice_crud's."""
    raws = []
    for n, (diff, _id, retryable) in enumerate(updates):
        entry = {
            "op": "u",
            "ns": "db.c",
            "ui": Binary(b"u" * 16, 4),
            "o": {"$v": 2, "diff": diff},
            "o2": {"_id": _id},
            **({"stmtId": 0} if retryable else {}),
            "ts": Timestamp(9, n),
            "t": Int64(1),
            "v": Int64(2),
            "wall": bson.datetime_ms.DatetimeMS(n),
        }
        raws.append(bson.encode(entry))
    with mock.patch(
        "buckets._columnar.update_descriptions._description",
        side_effect=AssertionError("an updateDescription made one by one"),
    ):
        batch, in_block = _same_as_one_by_one(raws, False)
    assert all(item is not None for item in batch)
    assert in_block == {n for n, (_, _id, _) in enumerate(updates) if _taken_key({"_id": _id})}


def test_splice_entries_takes_plain_batches_whole_and_anything_else_item_by_item() -> None:
    def insert(i: int, ns: str = "db.c") -> bytes:
        _id = ObjectId()
        return bson.encode(
            {
                "op": "i",
                "ns": ns,
                "ui": Binary(b"u" * 16, 4),
                "o": {"_id": _id, "i": i},
                "o2": {"_id": _id},
                "ts": Timestamp(9, i),
                "t": Int64(1),
                "v": Int64(2),
                "wall": bson.datetime_ms.DatetimeMS(i),
            }
        )

    batch = [insert(i) for i in range(BATCH_MIN)]
    batch[7] = bson.encode(
        {
            k: v
            for k, v in {**bson.decode(batch[7]), "op": "d", "o": {"_id": ObjectId()}}.items()
            if k != "o2"
        }
    )
    block = splice_entries(OplogBatch.of(batch), True, False)
    assert isinstance(block, EventBlock) and block.fields() == [
        splice_crud(raw, expanded=False) for raw in batch
    ]
    noop = bson.encode(
        {"op": "n", "ns": "", "o": {"msg": "x"}, "ts": Timestamp(9, 999), "t": Int64(1)}
    )
    items = splice_entries(OplogBatch.of([*batch, noop]), True, False)
    assert (
        isinstance(items, list)
        and items[1] == noop
        and as_fields(items[:1]) == [splice_crud(r, expanded=False) for r in batch]
    )
    # Runs between other entries are blocks; short runs are tuples.
    items = splice_entries(OplogBatch.of([*batch[:100], noop, *batch[100:]]), True, False)
    assert [type(i) for i in items] == [EventBlock, bytes, *[tuple] * (BATCH_MIN - 100)]
    assert as_fields(items[:1]) + items[2:] == [splice_crud(r, expanded=False) for r in batch]
    items = splice_entries(OplogBatch.of([*batch, insert(0, "config.x")]), True, False)
    assert isinstance(items, list) and items[-1] == ()
    assert splice_entries(OplogBatch.of(batch), False, False) == batch
    # Other entries first, last and between runs of every length: each entry's item in its place.
    mixed = [
        noop,
        noop,
        *batch[:40],
        noop,
        *batch[40:45],
        insert(1, "config.x"),
        noop,
        *batch[45:],
        noop,
    ]
    items = splice_entries(OplogBatch.of(mixed), True, False)
    assert [type(i) for i in items] == [
        bytes,
        bytes,
        EventBlock,
        bytes,
        *[tuple] * 5,
        tuple,
        bytes,
        EventBlock,
        bytes,
    ]
    assert items[9] == () and [len(i) for i in items if type(i) is EventBlock] == [
        40,
        BATCH_MIN - 45,
    ]
    assert as_fields(items) == [
        r if (made := splice_crud(r, expanded=False)) is None else made for r in mixed
    ]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("iudr"),
            compound_ids
            | st.integers(-(2**31), 2**31 - 1)
            | st.integers(-(2**63), 2**63 - 1).map(Int64),
        ),
        min_size=1,
        max_size=30,
    ),
    st.booleans(),
)
def test_compound_and_int_ids_are_keyed_in_the_block(
    writes: list[tuple[str, Any]], expanded: bool
) -> None:
    """Inserts, updates (unexpanded), replacements and deletes of int and compound `_id`s (int32s,
    int64s, strings, ObjectIds and documents of these) are made in the block, none one by one in
    Python, and each event is splice_crud's; its sort key ends with the general KeyString encoder's
    key of the documentKey, and its type bits are the general encoder's (keystring.py; the server's
    key_string.cpp `_appendInteger` for the ints, key_string.h TypeBits kInt 0 and kLong 1). Int64s
    of 2**62 or more and other values are left to the one-by-one path."""
    raws = []
    for n, (op, _id) in enumerate(writes):
        o: dict[str, Any] = (
            {"_id": _id, "a": n} if op in "ir" else {"$v": 2, "diff": {"u": {"a": n}}}
        )
        entry = {
            "op": "u" if op == "r" else op,
            "ns": "db.c",
            "ui": Binary(b"u" * 16, 4),
            "o": o,
            "o2": {"_id": _id},
        }
        if op == "d":
            entry = {**entry, "o": {"_id": _id}}
            del entry["o2"]
        entry.update(ts=Timestamp(9, n), t=Int64(1), v=Int64(2), wall=DatetimeMS(n))
        raws.append(bson.encode(entry))
    taken = {  # (expanded updates are left to splice_crud, see test_a_batch_splices...)
        n
        for n, (op, _id) in enumerate(writes)
        if _walked({"_id": _id}) and not (op == "u" and expanded)
    }
    with mock.patch(
        "buckets._columnar.batch_splice.splice_laid_out",
        side_effect=AssertionError("an event made one by one"),
    ):
        out, block, where = splice_block(
            OplogBatch.of([raws[n] for n in sorted(taken)]), expanded=expanded
        )
    assert len(where) == len(taken) and block is not None or not taken
    if block is not None:  # a reply's resume token after the block: its last event's, type bits too
        last = bson.decode(block.fields()[-1][5])["_id"]
        assert bson.encode(ColumnarRun(block).last_token()) == bson.encode(last)
    batch, in_block = _same_as_one_by_one(raws, expanded)
    assert in_block == taken
    for n, (_, _id) in enumerate(writes):
        if n in taken:
            ks = KeyStringBuilder()
            ks.append({"_id": _id})
            bits = encode_type_bits([0] * 7 + ks.bits)
            assert batch[n][0].endswith(ks.data + b"\x00\x04") and batch[n][1] == bits


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("rru"),
            ids.filter(lambda i: _taken_key({"_id": i})),
            # (a string value "$v" holds the bytes `$v\0`: such an o is splice_crud's to judge)
            _fields.filter(lambda f: b"$v\x00" not in bson.encode(f)),
        ),
        min_size=1,
        max_size=20,
    ),
    st.booleans(),
    st.booleans(),
)
def test_replacements_are_made_in_the_block(
    writes: list[tuple[str, Any, dict[str, Any]]], retryable: bool, expanded: bool
) -> None:
    """A replacement (op "u" whose `o` is the new document, led by its `_id`, no `$v` in it) of
    every documentKey kind the block takes is made in the block, none one by one, beside updates
    of the same collection and key kind (kinds apart: an update's and a replacement's entry
    bytes from op to ui are alike); its event is splice_crud's: operationType "replace" (in the
    token too), fullDocument the entry's `o`, documentKey its `o2`, no updateDescription (the
    server's src/mongo/db/pipeline/change_stream_event_transform.cpp, the kUpdate case: an `o`
    without `$v: 2` is a replacement)."""
    raws = []
    for n, (op, _id, fields) in enumerate(writes):
        o = {"_id": _id, **fields} if op == "r" else {"$v": 2, "diff": {"u": fields}}
        entry: dict[str, Any] = {
            "op": "u",
            "ns": "db.c",
            "ui": Binary(b"u" * 16, 4),
            "o": o,
            "o2": {"_id": _id},
            **({"stmtId": n} if retryable else {}),
            "ts": Timestamp(9, n),
            "t": Int64(1),
            "v": Int64(2),
            "wall": DatetimeMS(n),
        }
        if retryable:
            session = {"lsid": {"id": Binary(b"s" * 16, 4)}, "txnNumber": Int64(n)}
            entry = {**session, **entry, "prevOpTime": {"ts": Timestamp(0, 0), "t": Int64(-1)}}
        raws.append(bson.encode(entry))
    with (
        mock.patch(
            "buckets._columnar.batch_splice.splice_laid_out",
            side_effect=AssertionError("an event made one by one"),
        ),
        mock.patch(
            "buckets._columnar.batch_splice.splice_crud",
            side_effect=AssertionError("an event made one by one"),
        ),
    ):
        batch, in_block = _same_as_one_by_one(raws, expanded)
    assert in_block == {n for n, (op, _, _) in enumerate(writes) if op == "r" or not expanded}
    raw = CodecOptions(document_class=RawBSONDocument)
    for n, (op, _id, fields) in enumerate(writes):
        if op == "r":
            event = bson.decode(batch[n][5], raw)
            assert batch[n][2] == event["operationType"] == "replace"
            assert event["fullDocument"].raw == bson.encode({"_id": _id, **fields})
            assert event["documentKey"].raw == bson.encode({"_id": _id})
            assert "updateDescription" not in event


def test_a_replacement_is_told_by_the_bytes_dollar_v_zero_at_any_place() -> None:
    """A replacement's `o` holding the bytes `$v\0` anywhere (here in a binary value, at each
    offset from o's start to its end, its zero o's own terminator too) is left to splice_crud,
    one without them (near misses) is made in the block: splice_crud's `_diff_at` tells a diff
    from a replacement by these bytes. The block reads o a word at a time and its last bytes one
    by one, so every place in a word and in the last bytes is tried, for o of every length mod 8."""
    _id = ObjectId(b"i" * 12)
    middles = [b"$v\x00", b"$v", b"$v\x01", b"$w\x00", b"#v\x00", b"$", b"v\x00", b""]
    raws, expect = [], set()
    for before in range(17):
        for middle in middles:
            for after in range(3):
                o = {"_id": _id, "b": Binary(b"x" * before + middle + b"y" * after)}
                if _replacement_read(o):
                    expect.add(len(raws))
                entry = {
                    "op": "u",
                    "ns": "db.c",
                    "ui": Binary(b"u" * 16, 4),
                    "o": o,
                    "o2": {"_id": _id},
                    "ts": Timestamp(9, len(raws)),
                    "t": Int64(1),
                    "v": Int64(2),
                    "wall": DatetimeMS(len(raws)),
                }
                raws.append(bson.encode(entry))
    assert 0 < len(expect) < len(raws)
    _, in_block = _same_as_one_by_one(raws, False)
    assert in_block == expect
