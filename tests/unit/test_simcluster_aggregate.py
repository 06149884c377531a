"""The simulator's own aggregation stages (simcluster.aggregate), without a server: each $group
accumulator and the stages its table dispatches to, as the server computes them."""

from __future__ import annotations

import pytest

from mongoformats.errors import MongoError
from simcluster.aggregate import run_pipeline

DOCS = [{"_id": i, "g": i % 2, "v": i, "s": str(i)} for i in range(5)]


def test_group_accumulators():
    accumulators = {
        "sum": {"$sum": "$v"},
        "avg": {"$avg": "$v"},
        "mn": {"$min": "$v"},
        "mx": {"$max": "$v"},
        "f": {"$first": "$s"},
        "l": {"$last": "$s"},
        "p": {"$push": "$s"},
        "set": {"$addToSet": "$g"},
        "c": {"$count": {}},
    }
    out = run_pipeline(
        [dict(d) for d in DOCS], [{"$group": {"_id": "$g", **accumulators}}, {"$sort": {"_id": 1}}]
    )
    assert out == [
        {"_id": 0, "sum": 6, "mn": 0, "mx": 4, "f": "0", "l": "4", "p": ["0", "2", "4"]}
        | {"set": [0], "c": 3, "avg": 2.0},
        {"_id": 1, "sum": 4, "mn": 1, "mx": 3, "f": "1", "l": "3", "p": ["1", "3"]}
        | {"set": [1], "c": 2, "avg": 2.0},
    ]


def test_stages_in_order():
    pipeline = [
        {"$match": {"v": {"$gte": 1}}},
        {"$set": {"w": {"$add": ["$v", 10]}}},
        {"$unset": "s"},
        {"$sort": {"w": -1}},
        {"$skip": 1},
        {"$limit": 2},
        {"$replaceWith": {"x": "$w"}},
    ]
    assert run_pipeline([dict(d) for d in DOCS], pipeline) == [{"x": 13}, {"x": 12}]
    unwound = run_pipeline([{"_id": 1, "t": ["a", "b"]}, {"_id": 2}], [{"$unwind": "$t"}])
    assert unwound == [{"_id": 1, "t": "a"}, {"_id": 1, "t": "b"}]
    assert run_pipeline([dict(d) for d in DOCS], [{"$count": "n"}]) == [{"n": 5}]


@pytest.mark.parametrize(
    ("pipeline", "code"),
    [
        ([{"$bogus": 1}], 40324),
        ([{"$match": {}, "$limit": 1}], 40323),
        ([{"$group": {"_id": 1, "x": {"$nope": 1}}}], 15952),
    ],
)
def test_unknown_stages_and_accumulators_fail_as_on_a_server(pipeline, code):
    """Codes from the server's pipeline parser (document_source.cpp 40323, 40324) and
    accumulator parser (15952)."""
    with pytest.raises(MongoError) as caught:
        run_pipeline([dict(d) for d in DOCS], pipeline)
    assert caught.value.code == code
