"""The compiled update descriptions (buckets/_columnar/diff_kernel.py) are `update_description`'s
bytes for every diff the kernel takes: server-shaped diffs (nested `s<field>` sections, array
sections with `u<index>`, `s<index>` and `l`, `d`, with `u` and `i`, as the server's
document_diff_serialization.h and v2_log_builder.cpp write them), diffs of random shape
(duplicate names, unknown sections, other value types) and broken bytes; and an application's
updates (benchmarks/workloads.py's app mix, logged as simcluster's update log writes them) are
all taken by the kernel, none made one by one in Python.
"""

from __future__ import annotations

import random
import struct
from typing import Any
from unittest import mock

import bson
import numpy as np
from bson import Binary, Int64, ObjectId, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.workloads import _app_collections, _app_update
from buckets._columnar.byte_kernels import as_bytes
from buckets._columnar.diff_kernel import NO_REFCOUNTS, describe
from mongoformats.diff_splice import update_description
from simcluster.updates import pipeline_entry, update_with_entry
from tests.unit.test_batch_splice import _same_as_one_by_one, update_diffs
from tests.unit.test_oplog_splice import diffs, values

# Names that make each section of a diff, array indexes read otherwise (u01), sections a server
# does not write (b, x) and names of paths met twice (a.b beside sa's b).
_names = st.sampled_from(
    [
        "u",
        "i",
        "d",
        "l",
        "a",
        "s",
        "sa",
        "sb",
        "s0",
        "s1",
        "u0",
        "u1",
        "u01",
        "u10",
        "b",
        "x",
        "a.b",
    ]
)
_scalars = st.one_of(
    values,
    st.booleans(),
    st.integers(0, 3).map(Int64),
    st.floats(0, 3),
    st.binary(max_size=3),
    st.just(bson.Regex("x")),
    st.just(bson.Code("f", {})),
)
# A document as (name, value) pairs, names repeated at will; a value a pair list is a document.
_pairs = st.recursive(
    st.lists(st.tuples(_names, _scalars), max_size=4),
    lambda inner: st.lists(st.tuples(_names, st.one_of(_scalars, inner)), max_size=4),
    max_leaves=12,
)


def _encoded(pairs: list[tuple[str, Any]]) -> bytes:
    """The BSON document of these pairs in their order (a name twice stays twice)."""
    body = b"".join(
        b"\x03" + name.encode() + b"\x00" + _encoded(value)
        if isinstance(value, list) and value and all(isinstance(p, tuple) for p in value)
        else bson.encode({name: value})[4:-1]
        for name, value in pairs
    )
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


def _python_description(entry: bytes, at: int) -> bytes | None:
    try:
        return update_description(entry, at, expanded=False)
    except (ValueError, IndexError, struct.error):
        return None


def _kernel_matches(entries: list[tuple[bytes, int]]) -> list[bool]:
    """Describe the diffs (entry bytes, the diff's offset) in one batch; check each one the
    kernel takes against `update_description`; which it took."""
    data = b"".join(e for e, _ in entries) + bytes(16)  # (a batch's slack after its entries)
    starts = np.zeros(len(entries), np.int64)
    np.cumsum([len(e) for e, _ in entries[:-1]], out=starts[1:])
    ends = starts + [len(e) for e, _ in entries]
    at = starts + [a for _, a in entries]
    out, offsets, taken = describe(as_bytes(data), starts, ends, at)
    for k, (entry, a) in enumerate(entries):
        got = bytes(out[offsets[k] : offsets[k + 1]])
        if taken[k]:
            assert got == _python_description(entry, a), (entry, a)
        else:
            assert got == b""
    return taken.tolist()


def _entry(diff: bytes) -> tuple[bytes, int]:
    """An update's `o` around the diff's bytes, and where the diff starts in it."""
    head = b"\x10$v\x00\x02\x00\x00\x00\x03diff\x00"
    return struct.pack("<i", 4 + len(head) + len(diff) + 1) + head + diff + b"\x00", 4 + len(head)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(diffs, update_diffs), min_size=1, max_size=12))
def test_server_shaped_diffs_are_described_as_update_description_does(
    drawn: list[dict[str, Any]],
) -> None:
    entries = [_entry(bson.encode(diff)) for diff in drawn]
    taken = _kernel_matches(entries)
    # Every diff of these shapes the Python path takes is the kernel's too.
    for (entry, at), took in zip(entries, taken, strict=True):
        assert took or _python_description(entry, at) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(_pairs, min_size=1, max_size=12))
def test_diffs_of_any_shape_are_described_as_update_description_does_or_left(
    drawn: list[list[tuple[str, Any]]],
) -> None:
    _kernel_matches([_entry(_encoded(pairs)) for pairs in drawn])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(diffs, update_diffs), min_size=1, max_size=6), st.data())
def test_broken_diffs_are_described_as_update_description_does_or_left(
    drawn: list[dict[str, Any]], data: st.DataObject
) -> None:
    """A byte changed anywhere, or the entry cut short: what the kernel takes still reads as the
    Python path reads it, and it reads nothing past the entry."""
    entries = [_entry(bson.encode(diff)) for diff in drawn]
    broken = []
    for entry, at in entries:
        raw = bytearray(entry)
        for _ in range(data.draw(st.integers(0, 3))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        if data.draw(st.booleans()):
            raw = raw[: data.draw(st.integers(at, len(raw)))]
        broken.append((bytes(raw), at))
    _kernel_matches(broken)


def _pipeline_result(doc: dict[str, Any], stages: list[dict[str, Any]]) -> dict[str, Any]:
    """The app mix's pipeline update applied: one `$set` of literals and `$concat`s."""
    new = dict(doc)
    for name, value in stages[0]["$set"].items():
        if isinstance(value, dict) and "$literal" in value:
            value = value["$literal"]
        elif isinstance(value, dict):
            value = "".join(value["$concat"])
        new[name] = value
    return new


def _app_entries(seed: int, n: int) -> tuple[list[bytes], list[dict[str, Any]]]:
    """n updates of the app mix's documents as the oplog holds them (documents updated again
    and again, as the backlog does), and their diffs."""
    rng = random.Random(seed)
    colls = _app_collections()
    docs = [(c.name, {"_id": ObjectId(), **c.make_doc(rng)}) for c in colls for _ in range(3)]
    raws, logged = [], []
    while len(raws) < n:
        j = rng.randrange(len(docs))
        name, doc = docs[j]
        update = _app_update(rng, name)
        if isinstance(update, list):
            new = _pipeline_result(doc, update)
            o = pipeline_entry(doc, new)
        else:
            new, o = update_with_entry(doc, update)
        docs[j] = (name, new)
        if o is None or "$v" not in o:
            continue
        logged.append(o["diff"])
        entry = {
            "op": "u",
            "ns": "app." + name,
            "ui": Binary(b"u" * 16, 4),
            "o": o,
            "o2": {"_id": doc["_id"]},
            "ts": Timestamp(9, len(raws)),
            "t": Int64(1),
            "v": Int64(2),
            "wall": bson.datetime_ms.DatetimeMS(len(raws)),
        }
        raws.append(bson.encode(entry))
    return raws, logged


def test_the_app_mixs_updates_are_described_by_the_kernel() -> None:
    """Nested `$set`s, `$push`, `$pull`, `$addToSet`, array-index `$set`s, `$unset`, `$rename`
    and pipeline `$set`s: every update's description is written by the kernels (none by
    `update_description`), and its event is splice_crud's."""
    raws, logged = _app_entries(5, 400)
    # (the mix's shapes are all there: a removal, an object's sub-diff, an array's new element
    # and an element's sub-diff; the server logs a `$pull`'s array whole, in `u`)
    subs = [value for diff in logged for key, value in diff.items() if key[0] == "s"]
    arrays = [set(key[0] for key in sub if key != "a") for sub in subs if "a" in sub]
    assert any("d" in diff for diff in logged) and any("a" not in sub for sub in subs)
    assert {"u"} in arrays and {"s"} in arrays
    with mock.patch(
        "buckets._columnar.update_descriptions._description",
        side_effect=AssertionError("an updateDescription made one by one"),
    ):
        batch, in_block = _same_as_one_by_one(raws, False)
    assert in_block == set(range(len(raws)))


def test_large_deep_and_repeated_diffs() -> None:
    """Many paths (sorted to find one named twice), descriptions longer than the buffers first
    made for them (grown, the diff written again), and diffs nested deeper than the kernel's
    stack (left to Python)."""
    many = {f"f{j}": j for j in range(200)}
    deep: dict[str, Any] = {"u": many}
    for depth in range(30):
        deep = {f"s{'n' * 20}{depth}": deep}
    deeper: dict[str, Any] = {"u": {"x": 1}}
    for _ in range(70):
        deeper = {"sn": deeper}
    twice = [("u", [(f"f{j}", j) for j in range(40)] + [("f7", 0)]), ("sa", [("u", [("b", 1)])])]
    entries = [
        _entry(bson.encode({"u": {"a": 1}, "sb": {"u": many}})),
        _entry(bson.encode(deep)),
        _entry(_encoded(twice)),
        _entry(bson.encode(deeper)),
        _entry(bson.encode({"d": {"x": False}})),
    ]
    assert _kernel_matches(entries) == [True, True, False, False, True]


def test_the_walk_is_compiled_without_reference_counts_on_this_numba() -> None:
    """The option is numba's own, not public: a numba that drops it still compiles the kernel
    (with counts), and this test says the speed is gone."""
    assert NO_REFCOUNTS == {"_nrt": False}


def test_the_steps_compiled_apart_take_the_bytes_and_buffers_as_addresses() -> None:
    """A call between kernels passes an array as seven numbers: the steps compiled apart take
    the entry bytes and the buffers as addresses and lengths (Data), and one array, the state."""
    from buckets._columnar import diff_kernel, diff_steps

    for step in (
        diff_kernel._scan,
        diff_kernel._object,
        diff_kernel._one,
        diff_steps._copied,
        diff_steps._removed,
        diff_steps._truncated,
        diff_steps._twice,
        diff_steps._close,
    ):
        annotations = step.py_func.__annotations__
        arrays = [name for name, kind in annotations.items() if kind in ("_B8", "_I64")]
        assert arrays == ["st"], (step, annotations)
