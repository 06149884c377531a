"""The replication sink's update operators (bucketspark.sink.update_ops) for awkward paths, without
a cluster (tests/integration/test_sink.py applies events to a target simcluster)."""

from __future__ import annotations

import pytest

from bucketspark.sink import update_ops


def test_plain_paths_stay_update_operators_and_a_truncated_array_is_cut_first() -> None:
    """The usual update needs no pipeline (any target version); an array cut short whose
    elements also changed is two updates, since one may not touch a path and its prefix."""
    key = {"_id": 1}
    plain = update_ops(
        key,
        {
            "updatedFields": {"a.b": 1, "arr.0": 5},
            "removedFields": ["c"],
            "truncatedArrays": [{"field": "arr", "newSize": 2}],
            "disambiguatedPaths": {"arr.0": ["arr", 0]},
        },
    )
    assert [op._doc for op in plain] == [
        {"$push": {"arr": {"$each": [], "$slice": 2}}},
        {"$set": {"a.b": 1, "arr.0": 5}, "$unset": {"c": ""}},
    ]
    dotted = update_ops(
        key,
        {
            "updatedFields": {"a.b": 1},
            "removedFields": [],
            "truncatedArrays": [],
            "disambiguatedPaths": {"a.b": ["a.b"]},
        },
    )
    assert dotted[0]._doc == [
        {
            "$replaceWith": {
                "$setField": {
                    "field": {"$literal": "a.b"},
                    "input": "$$ROOT",
                    "value": {"$literal": 1},
                }
            }
        }
    ]


def test_an_ambiguous_path_without_disambiguated_paths_is_refused_not_guessed() -> None:
    """Without expanded events, `x.0.$y` may be field "0" or element 0: no guess is written."""
    with pytest.raises(ValueError, match="showExpandedEvents"):
        update_ops(
            {"_id": 1}, {"updatedFields": {"x.0.$y": 1}, "removedFields": [], "truncatedArrays": []}
        )
    # Without a dot or a $ the target resolves the digits as the source did: operators.
    assert update_ops(
        {"_id": 1}, {"updatedFields": {"x.0.y": 1}, "removedFields": [], "truncatedArrays": []}
    )[0]._doc == {"$set": {"x.0.y": 1}}
