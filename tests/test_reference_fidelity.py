"""The audit's items (shared/reference/fidelity-audit-2026-11-26.md) that the shared transform got
wrong, each checked on the engine and on simcluster's independent reference.

The server sources are cited per test; each test runs both implementations, so a later change
to either that leaves the server's behaviour fails here."""

from __future__ import annotations

from typing import Any

import pytest

from mongoformats.update_diff import update_description_from_diff
from simcluster.reference_diff import describe_update


def _engine(diff: dict[str, Any]) -> dict[str, Any]:
    return update_description_from_diff(diff, disambiguate=True)


def _reference(diff: dict[str, Any]) -> dict[str, Any]:
    return describe_update({"$v": 2, "diff": diff}, expanded=True)


both = pytest.mark.parametrize("describe", [_engine, _reference], ids=["engine", "reference"])


@both
def test_d10_array_index_not_ambiguous(describe):
    """An array index alone never makes a path ambiguous: change_stream_document_diff_parser.cpp
    (_appendFieldToPath: "the presence of an array index is not itself sufficient to make the path
    ambiguous"); jstests/change_streams/expanded_update_description.js expects
    `disambiguatedPaths: {}` for a path of non-dotted fields and array indices."""
    push = describe({"sarr": {"a": True, "u4": 5}})
    assert push["updatedFields"] == {"arr.4": 5} and push["disambiguatedPaths"] == {}
    deep = describe({"stopLevelArray": {"a": True, "s0": {"ssubArray": {"a": True, "s1": {
        "a": True, "s1": {"a": True, "s0": {"sbottomArray": {"a": True, "u2": "x"}}}}}}}})
    assert deep["updatedFields"] == {"topLevelArray.0.subArray.1.1.0.bottomArray.2": "x"}
    assert deep["disambiguatedPaths"] == {}


@both
def test_d10_leading_numeric_field_not_ambiguous(describe):
    """"We don't include numeric fields at the start of the path because those are unambiguous"
    (same function): `isNumeric` needs numParts() > 1."""
    assert describe({"u": {"0": 1}})["disambiguatedPaths"] == {}
    assert describe({"s0": {"u": {"a": 1}}})["disambiguatedPaths"] == {}


@both
def test_d10_numeric_field_below_the_top_is_ambiguous(describe):
    """A numeric object field below the top level, or a dotted field anywhere, makes the path
    ambiguous from there on; indices below it are then reported as integers."""
    assert describe({"sm": {"s1": {"u": {"a": 5}}}})["disambiguatedPaths"] == {"m.1.a": ["m", "1", "a"]}
    assert describe({"sm": {"s1": {"a": True, "u0": 3}}})["disambiguatedPaths"] == {"m.1.0": ["m", "1", 0]}
    assert describe({"u": {"a.b": 1}})["disambiguatedPaths"] == {"a.b": ["a.b"]}
    assert describe({"sm": {"s01": {"u": {"a": 5}}}})["disambiguatedPaths"] == {}  # not strictly numeric


@both
def test_d10_order_updates_inserts_deletes_then_subdiffs(describe):
    """buildUpdateDescriptionWithDeltaOplog reads every update, then every insert, then every
    delete, then the sub-diffs, whatever the sections' order in the diff."""
    got = describe({"d": {"a.b": False}, "sx": {"u": {"y": 1}}, "i": {"e.f": 2}, "u": {"c.d": 1}})
    assert list(got["updatedFields"]) == ["c.d", "e.f", "x.y"]
    assert got["removedFields"] == ["a.b"]
    assert list(got["disambiguatedPaths"]) == ["c.d", "e.f", "a.b"]


def test_d10_fast_path_orders_updates_before_inserts():
    """The byte path (oplog_splice.update_description) takes `u` before `i` as the server reads
    them, also when a diff lists `i` first."""
    import bson

    from mongoformats.oplog_splice import elements, update_description

    diff = {"i": {"n": 1}, "d": {"gone": False}, "u": {"a": 2}}
    raw = bson.encode({"diff": diff})
    got = update_description(raw, elements(raw)[b"diff"][1], expanded=False)
    assert got == bson.encode(update_description_from_diff(diff))
    assert list(bson.decode(got)["updatedFields"]) == ["a", "n"]
