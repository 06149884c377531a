"""The byte-splicing fast path gives exactly the events of the general transform.

The general path (`transform_decoded`) is the one checked against the documented server shapes
(test_simcluster) and the spec tests; these tests pin the fast path to it byte for byte.
"""

from __future__ import annotations

import uuid
from typing import Any

import bson
from bson import Binary, Int64, ObjectId, Timestamp
from bson.raw_bson import RawBSONDocument
from hypothesis import given, settings
from hypothesis import strategies as st

from mongoformats.change_events import RAW, OplogTransformer
from mongoformats.oplog_splice import (
    _fixed_layout,
    _walked_layout,
    array_of,
    cursor_document,
    document_parts,
    elements,
    splice_crud,
    update_description,
)
from mongoformats.update_diff import update_description_from_diff

ids = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**62), 2**62).map(Int64),
    st.text(max_size=12),
    st.builds(ObjectId),
    st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda f: f == int(f) and abs(f) < 2**52
    ),
    st.none(),
    # What the general encoder keys for the splice (`_decoded_document_key`): UUIDs and other
    # binary ids, compound ids, fractional doubles, decimals, dates.
    st.uuids().map(lambda u: Binary(u.bytes, 4)),
    st.binary(max_size=8),
    st.fixed_dictionaries({"store": st.integers(0, 40), "sku": st.text(max_size=5)}),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(-(10**6), 10**6, places=2).map(lambda d: bson.Decimal128(str(d))),
    st.integers(0, 2**41).map(bson.datetime_ms.DatetimeMS),
)
values = st.recursive(
    st.one_of(st.integers(-5, 5), st.text(max_size=4), st.none(), st.booleans()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abxy"), inner, max_size=3)
    ),
    max_leaves=6,
)
_sections = {
    # "a.b" and "b" also come as paths of sub-diffs: a path met twice goes the general way.
    "u": st.dictionaries(st.sampled_from(["a", "b", "1", "a.b"]), values, min_size=1, max_size=2),
    "i": st.dictionaries(st.sampled_from(["c", "d.e"]), values, min_size=1, max_size=2),
    "d": st.dictionaries(st.sampled_from(["x", "y", "b"]), st.just(False), min_size=1, max_size=2),
}


def _nested_diffs(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Object diffs whose sub-diffs (`s<field>`) are object or array diffs, as a server writes
    for nested `$set`s, `$push`es and array-index sets (document_diff_serialization.h)."""
    arrays = st.fixed_dictionaries(
        {"a": st.just(True)},
        optional={
            "l": st.one_of(st.integers(0, 3), st.integers(0, 3).map(Int64)),
            "u0": values,
            "s1": inner,
            "u2": values,
            "u10": values,
            "u01": values,
        },
    )  # u01: an index the general path reads with int()
    return st.fixed_dictionaries(
        {}, optional={**_sections, "sa": st.one_of(inner, arrays), "s1": inner, "sarr": arrays}
    )


diffs = st.recursive(st.fixed_dictionaries({}, optional=_sections), _nested_diffs, max_leaves=4)


def write_body(draw: st.DrawFn, op: str, key: dict[str, Any]) -> dict[str, Any]:
    """A write's `o` and `o2` for its documentKey `key`: an insert's document (its o2 now and
    then), a delete's key, a replacement (`r`, logged as `u`) or a `$v: 2` diff."""
    doc = {**key, "v": draw(values)}
    if op == "i":
        return {"o": doc, "o2": key} if draw(st.booleans()) else {"o": doc}
    if op == "d":
        return {"o": key}
    if op == "r":
        return {"o": doc, "o2": key}
    return {"o": {"$v": 2, "diff": draw(diffs)}, "o2": key}


@st.composite
def crud_entries(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(["i", "u", "r", "d"]))
    _id = draw(ids)
    key: dict[str, Any] = {"_id": _id}
    if draw(st.booleans()):
        key = {"sk": draw(ids), "_id": _id}
    ns = draw(st.sampled_from(["db.c", "db.c.d", "admin.x", "db.system.views", "other.coll"]))
    entry: dict[str, Any] = {"op": "u" if op == "r" else op, "ns": ns}
    if draw(st.booleans()):
        entry["ui"] = Binary(uuid.UUID(int=draw(st.integers(0, 2**128 - 1))).bytes, 4)
    entry.update(write_body(draw, op, key))
    retryable = draw(st.booleans())
    if retryable:
        entry["stmtId"] = 0
    entry["ts"] = Timestamp(draw(st.integers(1, 2**32 - 1)), draw(st.integers(0, 2**32 - 1)))
    entry["t"], entry["v"] = Int64(1), Int64(2)
    if draw(st.booleans()):
        entry["wall"] = bson.datetime_ms.DatetimeMS(draw(st.integers(0, 2**41)))
    if retryable:  # a retryable write's session fields, where the server puts them (or elsewhere)
        session = {
            "lsid": {"id": Binary(uuid.uuid4().bytes, 4)},
            "txnNumber": Int64(draw(st.integers(0, 9))),
        }
        prev = {"prevOpTime": {"ts": Timestamp(0, 0), "t": Int64(-1)}}
        entry = (
            {**session, **entry, **prev} if draw(st.booleans()) else {**entry, **session, **prev}
        )
    return entry


@settings(max_examples=400, deadline=None)
@given(crud_entries(), st.booleans())
def test_spliced_events_equal_the_general_transform(entry: dict[str, Any], expanded: bool) -> None:
    raw = bson.encode(entry)
    tr = OplogTransformer(show_expanded_events=expanded)
    assert tr.transform(raw) == tr.transform_decoded(RawBSONDocument(raw, RAW))


@settings(max_examples=300, deadline=None)
@given(crud_entries())
def test_the_fixed_layout_agrees_with_the_walk(entry: dict[str, Any]) -> None:
    """Where the fixed-position parse of the usual entry shape applies, it finds what the walk
    finds."""
    raw = bson.encode(entry)
    fixed, walked = _fixed_layout(raw), _walked_layout(raw)
    assert fixed is None or fixed == walked
    idl = [
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
    if (
        "wall" in entry and list(entry) == sorted(entry, key=idl.index) and walked is not None
    ):  # as servers write
        assert fixed is not None


def test_the_fast_path_takes_the_common_shapes() -> None:
    """Plain inserts, updates (nested and array diffs too), replaces and deletes with ObjectId,
    int, string, UUID and compound ids never fall back."""
    for _id in (
        ObjectId(),
        7,
        Int64(2**40),
        "k",
        Binary(uuid.uuid4().bytes, 4),
        {"store": 3, "sku": "s-1"},
    ):
        for entry in (
            {"op": "i", "ns": "a.b", "o": {"_id": _id, "x": 1}, "o2": {"_id": _id}},
            {"op": "u", "ns": "a.b", "o": {"$v": 2, "diff": {"u": {"x": 2}}}, "o2": {"_id": _id}},
            {
                "op": "u",
                "ns": "a.b",
                "o2": {"_id": _id},
                "o": {"$v": 2, "diff": {"sa": {"u": {"b": 1}, "sc": {"a": True, "u0": 2, "l": 1}}}},
            },
            {"op": "u", "ns": "a.b", "o": {"_id": _id, "x": 3}, "o2": {"_id": _id}},
            {"op": "d", "ns": "a.b", "o": {"_id": _id}},
        ):
            assert splice_crud(bson.encode({**entry, "ts": Timestamp(5, 1)}), expanded=False)


def test_binary_and_compound_document_keys_are_spliced_like_the_general_transform() -> None:
    """The splice writes the KeyString of binary ids (short and past 254 bytes, where its size
    takes five bytes) and of compound and nested ids itself; the token equals the general one."""
    for _id in (
        Binary(uuid.uuid4().bytes, 4),
        Binary(b"x" * 300, 0),
        b"",
        {"store": 3, "sku": "s-1"},
        {"a": {"b": Binary(b"k", 5), "c": Int64(-4)}, "d": "e"},
        {"f": 1.5},
    ):
        for expanded in (False, True):
            for entry in (
                {"op": "i", "ns": "a.b", "o": {"_id": _id, "x": 1}, "o2": {"_id": _id}},
                {"op": "d", "ns": "a.b", "o": {"sk": _id, "_id": 1}},
            ):
                raw = bson.encode({**entry, "ts": Timestamp(5, 1)})
                tr = OplogTransformer(show_expanded_events=expanded)
                assert splice_crud(raw, expanded=expanded)
                assert tr.transform(raw) == tr.transform_decoded(RawBSONDocument(raw, RAW))


def test_an_update_description_is_the_diffs_own_bytes_for_top_level_sections() -> None:
    """Values of every common type are copied, not decoded: the bytes equal the general path's
    (whose decode-encode round trip keeps these types); other diffs are left to it."""
    values = {
        "d": 1.5,
        "s": "x",
        "o": {"a": [1, {"b": None}]},
        "b": Binary(b"xy", 5),
        "id": ObjectId(),
        "t": True,
        "dt": bson.datetime_ms.DatetimeMS(1),
        "re": bson.Regex("a", "i"),
        "l": Int64(3),
        "dec": bson.Decimal128("1.1"),
        "ts": Timestamp(1, 2),
    }
    for diff in (
        {"u": values},
        {"i": values},
        {"d": {"x": False, "y.z": False}, "u": {"a": 1}, "i": {"b": 2}},
        {"u": {}},
        {},
    ):
        raw = bson.encode({"diff": diff})
        got = update_description(raw, elements(raw)[b"diff"][1], expanded=False)
        assert got == bson.encode(update_description_from_diff(diff))
    for diff, expanded in (
        ({"u": {"a": 1}}, True),
        ({"u": 5}, False),
        ({"sa": 1}, False),
        ({"u": {"a.b": 1}, "sa": {"u": {"b": 2}}}, False),
        ({"sa": {"a": True, "u01": 1}}, False),
    ):
        raw = bson.encode({"diff": diff})
        assert update_description(raw, elements(raw)[b"diff"][1], expanded=expanded) is None


def test_a_nested_update_description_is_made_from_the_diffs_bytes() -> None:
    """Sub-diffs of objects and arrays (nested `$set`, `$push`, array-index sets, truncations)
    give the general path's updateDescription: paths dotted in its order, values as they are."""
    values = {
        "s": "x",
        "o": {"a": [1, {"b": None}]},
        "l": Int64(3),
        "dt": bson.datetime_ms.DatetimeMS(1),
    }
    for diff in (
        {"sa": {"u": values, "sb": {"i": {"c": 1}, "d": {"e": False}}}},
        {"u": {"v": 1}, "sitems": {"a": True, "l": 2, "u1": {"sku": "k"}, "s0": {"u": {"qty": 4}}}},
        {"sarr": {"a": True, "u3": [1, 2], "s1": {"a": True, "u0": "z"}}, "d": {"gone": False}},
        {"s1": {"u": {"2": True}}, "i": {"new": values}},
    ):
        raw = bson.encode({"diff": diff})
        got = update_description(raw, elements(raw)[b"diff"][1], expanded=False)
        assert got == bson.encode(update_description_from_diff(diff))


def test_elements_walks_every_bson_type() -> None:
    doc = {
        "d": 1.5,
        "s": "x",
        "o": {"a": 1},
        "a": [1],
        "b": Binary(b"xy", 5),
        "id": ObjectId(),
        "t": True,
        "dt": bson.datetime_ms.DatetimeMS(1),
        "n": None,
        "re": bson.Regex("a", "i"),
        "c": bson.Code("f"),
        "i": 1,
        "ts": Timestamp(1, 2),
        "l": Int64(3),
        "dec": bson.Decimal128("1.1"),
        "min": bson.MinKey(),
        "max": bson.MaxKey(),
    }
    raw = bson.encode(doc)
    found = elements(raw)
    assert [k.decode() for k in found] == list(doc)
    for name, (t, v, e) in found.items():
        body = bytes([t]) + name + b"\x00" + raw[v:e]
        single = (len(body) + 5).to_bytes(4, "little") + body + b"\x00"
        assert single == bson.encode({name.decode(): doc[name.decode()]})


def test_array_of_encodes_like_bson_at_every_size():
    for n in (0, 1, 2, 3, 4, 5, 1023, 1024, 1025, 70_000):  # cached index keys, and past the cache
        items = [bson.encode({"a": i}) for i in range(n)]
        assert (
            b"\x04x\x00" + array_of(items) == bson.encode({"x": [{"a": i} for i in range(n)]})[4:-1]
        )


def test_a_spliced_cursor_document_encodes_like_bson_wherever_it_is_embedded():
    """A reply's cursor stays pieces until the reply is joined; embedded at the top
    (document_parts), in an array (bson.encode) or read as a mapping, it is the same document."""
    items = [bson.encode({"_id": i, "v": "x" * i}) for i in range(50)]
    cursor = cursor_document(
        7, "db.coll", "nextBatch", items, {"postBatchResumeToken": {"_data": "82AB"}}
    )
    plain = {
        "id": Int64(7),
        "ns": "db.coll",
        "nextBatch": [bson.decode(d) for d in items],
        "postBatchResumeToken": {"_data": "82AB"},
    }
    assert cursor.raw == bson.encode(plain) and cursor.size == len(cursor.raw)
    assert b"".join(document_parts({"cursor": cursor, "ok": 1.0})) == bson.encode(
        {"cursor": plain, "ok": 1.0}
    )
    assert bson.encode({"cursors": [cursor]}) == bson.encode({"cursors": [plain]})
    assert cursor["id"] == 7 and len(cursor["nextBatch"]) == 50 and list(cursor) == list(plain)


def test_a_batch_of_small_documents_is_a_few_pieces_and_a_large_one_is_not_copied():
    """A reply's batch is the same bytes as bson.encode's whatever its documents' sizes, but
    small documents are joined with their keys a few hundred to a piece (each piece costs the
    sender more than copying a small document), and a large one stays the object it was, not
    copied; keys stay right across the joined pieces' edges and past the cached keys."""
    large = bson.encode({"_id": -1, "v": "y" * (20 << 10)})
    for n, at in ((0, ()), (1, ()), (700, ()), (700, (0, 255, 256, 699)), (70_000, (65_600,))):
        items = [bson.encode({"_id": i}) for i in range(n)]
        for i in at:
            items[i] = large
        cursor = cursor_document(1, "db.c", "nextBatch", items, {"postBatchResumeToken": {}})
        plain = {"id": Int64(1), "ns": "db.c", "nextBatch": [bson.decode(d) for d in items]}
        assert cursor.raw == bson.encode({**plain, "postBatchResumeToken": {}})
        assert cursor.size == len(cursor.raw)
        assert sum(p is large for p in cursor.parts) == len(at)
        assert len(cursor.parts) <= 8 + n // 256 + 3 * len(at)


def test_uuid_keys_and_replacements_are_spliced_without_walking_them(monkeypatch: Any) -> None:
    """A `{_id: <16 bytes of binary>}` documentKey is keyed, and a replacement (its _id first, as a
    server writes it) told from an update, from where their bytes must lie: no element walk. The
    events equal the general transform's; a document holding the bytes `$v` is still walked."""
    from mongoformats import oplog_splice

    def walked(*_: Any) -> Any:
        raise AssertionError("walked")

    ids = [Binary(uuid.uuid4().bytes, 4), Binary(uuid.uuid4().bytes, 3), Binary(b"k" * 16, 0)]
    fast = [{"op": "d", "ns": "a.b", "o": {"_id": _id}} for _id in ids]
    fast += [{"op": "i", "ns": "a.b", "o": {"_id": _id, "x": 1}, "o2": {"_id": _id}} for _id in ids]
    fast += [
        {"op": "u", "ns": "a.b", "o": {"_id": _id, "x": {"y": [1, "v"]}}, "o2": {"_id": _id}}
        for _id in ids
    ]
    walked_too = [
        {"op": "u", "ns": "a.b", "o": {"_id": 1, "x": "$v"}, "o2": {"_id": 1}},
        {"op": "u", "ns": "a.b", "o": {"_id": 1, "$v": 1}, "o2": {"_id": 1}},
        {"op": "u", "ns": "a.b", "o": {"x": 1, "_id": 1}, "o2": {"_id": 1}},
    ]
    stamps = {
        "ts": Timestamp(5, 1),
        "t": Int64(1),
        "v": Int64(2),
        "wall": bson.datetime_ms.DatetimeMS(5000),
    }
    raws = [bson.encode({**entry, **stamps}) for entry in fast + walked_too]
    want = [OplogTransformer().transform_decoded(RawBSONDocument(raw, RAW)) for raw in raws]
    with monkeypatch.context() as patched:
        patched.setattr(oplog_splice, "_ks_document_key", walked)
        patched.setattr(oplog_splice, "elements", walked)
        assert [OplogTransformer().transform(raw) for raw in raws[: len(fast)]] == want[: len(fast)]
    assert [OplogTransformer().transform(raw) for raw in raws] == want
