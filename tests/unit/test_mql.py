"""mongoformats.mql: BSON comparison order and query matching, as the server compares values
(shared by simcluster's queries and the engine's $match on events)."""

from __future__ import annotations

import datetime
import re

import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from hypothesis import given
from hypothesis import strategies as st

from mongoformats.bson_order import compare, sort_key
from mongoformats.errors import MongoError
from mongoformats.mql import matches, unsupported_in_query

# One value of each canonical type, in the order the server documents for comparison and sort
# (docs: "Comparison/Sort Order"): MinKey, null, numbers, strings, objects, arrays, binData,
# ObjectId, booleans, dates, timestamps, regular expressions, MaxKey.
ASCENDING = [
    MinKey(),
    None,
    -1e300,
    -3,
    0,
    Decimal128("0.5"),
    1.0,
    Int64(2**40),
    "",
    "a",
    "b",
    {},
    {"a": 1},
    [],
    [1],
    Binary(b"", 0),
    Binary(b"\x00", 0),
    ObjectId("000000000000000000000000"),
    False,
    True,
    datetime.datetime(1970, 1, 1),
    datetime.datetime(2020, 1, 1),
    Timestamp(1, 1),
    Timestamp(1, 2),
    Regex("a"),
    Code("x"),
    MaxKey(),
]


def test_values_of_every_type_compare_in_the_servers_order():
    for i, a in enumerate(ASCENDING):
        for j, b in enumerate(ASCENDING):
            assert compare(a, b) == (i > j) - (i < j), (a, b)


numbers = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.integers(-(2**53), 2**53).map(float),
)


@given(numbers, numbers)
def test_numbers_of_every_type_compare_by_value(a, b):
    assert compare(a, b) == (int(a) > int(b)) - (int(a) < int(b))
    assert compare(Decimal128(str(int(a))), b) == compare(a, b)


@given(st.one_of(st.text(), numbers), st.one_of(st.text(), numbers))
def test_strings_and_integers_compare_as_their_keystrings_do(a, b):
    """compare's shortcut for two strings or two integers orders them as their KeyStrings do
    (strings by UTF-8 bytes), as the matcher's equality shortcut does for equal types."""
    ka, kb = sort_key(a), sort_key(b)
    assert compare(a, b) == (ka > kb) - (ka < kb)
    assert matches({"v": a}, {"v": b}) == (ka == kb) == matches({"v": a}, {"v": {"$in": [b]}})


def test_equality_matches_equal_numbers_and_nothing_of_another_type():
    docs = [
        {"_id": 14},
        {"_id": 14.0},
        {"_id": Int64(14)},
        {"_id": Decimal128("14")},
        {"_id": Decimal128("14.5")},
        {"_id": datetime.datetime(2020, 1, 1)},
        {"_id": Binary(b"x", 4)},
        {"_id": "14"},
        {"_id": [14]},
    ]
    # Values of every type compare by value (Decimal128, dates and binData too), never all equal.
    for probe, want in (
        (14, 5),
        (Decimal128("14.5"), 1),
        (datetime.datetime(2020, 1, 1), 1),
        ("14", 1),
    ):
        assert sum(matches(d, {"_id": probe}) for d in docs) == want, probe
    assert [
        d["_id"] for d in docs if matches(d, {"$or": [{"_id": Decimal128("14.5")}, {"_id": "14"}]})
    ] == [Decimal128("14.5"), "14"]


def test_range_operators_only_match_values_of_the_comparands_type():
    docs = [
        {"v": 5},
        {"v": Decimal128("7.5")},
        {"v": "z"},
        {"v": datetime.datetime(2020, 1, 1)},
        {"v": None},
        {"v": True},
        {"v": MaxKey()},
    ]
    assert [d["v"] for d in docs if matches(d, {"v": {"$gt": 1}})] == [5, Decimal128("7.5")]
    assert [d["v"] for d in docs if matches(d, {"v": {"$lt": "zz"}})] == ["z"]
    assert [d["v"] for d in docs if matches(d, {"v": {"$gte": datetime.datetime(2000, 1, 1)}})] == [
        datetime.datetime(2020, 1, 1)
    ]
    assert [d["v"] for d in docs if matches(d, {"v": {"$gte": False}})] == [True]
    assert [
        d["v"] for d in docs if matches(d, {"v": {"$in": [Decimal128("5"), re.compile("^z")]}})
    ] == [5, "z"]


def test_type_matches_by_alias_or_number():
    docs = [
        {"v": 1},
        {"v": Int64(1)},
        {"v": 1.5},
        {"v": Decimal128("1")},
        {"v": "s"},
        {"v": datetime.datetime(2020, 1, 1)},
        {"v": Timestamp(1, 1)},
        {"v": True},
        {"v": None},
    ]

    def typed(alias):
        return [d["v"] for d in docs if matches(d, {"v": {"$type": alias}})]

    assert typed("number") == [1, Int64(1), 1.5, Decimal128("1")]
    assert (
        typed("decimal") == [Decimal128("1")]
        and typed(18) == [Int64(1)]
        and typed("null") == [None]
    )
    assert typed("date") == [datetime.datetime(2020, 1, 1)] and typed("timestamp") == [
        Timestamp(1, 1)
    ]
    assert typed(["string", "bool"]) == ["s", True]


def test_type_tests_array_elements_and_regex_options_take_every_flag():
    assert matches({"v": [1, "x"]}, {"v": {"$type": "string"}})
    assert matches({"v": [1]}, {"v": {"$type": "array"}}) and not matches(
        {"v": 1}, {"v": {"$type": "array"}}
    )
    assert matches({"v": "a\nB"}, {"v": {"$regex": "^b$", "$options": "im"}})
    assert matches({"v": "a\nb"}, {"v": {"$regex": "a.b", "$options": "s"}})
    assert matches({"v": "ab"}, {"v": {"$regex": "a b # spaced", "$options": "x"}})


# One document, and for each field operator a query that matches it and one that does not, as the
# server's query docs describe each (docs: "Query and Projection Operators": comparison, element,
# array and evaluation operators; an operator tests an array field's elements too).
OPERATOR_DOC = {"a": [1, 5], "s": "abc", "n": None, "d": [{"x": 1}, {"x": 3}], "t": 2}
OPERATOR_QUERIES = [
    ({"t": {"$eq": 2}}, True),
    ({"a": {"$eq": 5}}, True),
    ({"gone": {"$eq": None}}, True),
    ({"t": {"$eq": 3}}, False),
    ({"t": {"$ne": 2}}, False),
    ({"a": {"$ne": 7}}, True),
    ({"a": {"$gt": 4}}, True),
    ({"a": {"$gte": 6}}, False),
    ({"a": {"$lt": 2}}, True),
    ({"a": {"$lte": 0}}, False),
    ({"t": {"$gt": "a"}}, False),
    ({"t": {"$gte": 2}}, True),
    ({"a": {"$in": [7, 5]}}, True),
    ({"s": {"$in": [re.compile("^ab")]}}, True),
    ({"s": {"$in": [Regex("^x")]}}, False),
    ({"a": {"$nin": [1]}}, False),
    ({"t": {"$nin": [1]}}, True),
    ({"n": {"$exists": True}}, True),
    ({"gone": {"$exists": False}}, True),
    ({"t": {"$exists": False}}, False),
    ({"a": {"$size": 2}}, True),
    ({"a": {"$size": 1}}, False),
    ({"a": {"$all": [1, 5]}}, True),
    ({"a": {"$all": [1, 6]}}, False),
    ({"d": {"$elemMatch": {"x": {"$gt": 2}}}}, True),
    ({"d": {"$elemMatch": {"x": 2}}}, False),
    ({"a": {"$elemMatch": {"$gt": 4, "$lt": 6}}}, True),
    ({"a": {"$elemMatch": {"$gt": 5}}}, False),
    ({"t": {"$not": {"$gt": 1}}}, False),
    ({"s": {"$not": re.compile("^z")}}, True),
    ({"s": {"$regex": "B", "$options": "i"}}, True),
    ({"s": {"$regex": "^b"}}, False),
    ({"t": {"$type": "int"}}, True),
    ({"t": {"$type": "string"}}, False),
]


def test_every_field_operator_matches_as_the_server_documents():
    for query, expected in OPERATOR_QUERIES:
        assert matches(OPERATOR_DOC, query) is expected, query


def test_an_unknown_field_operator_is_the_servers_bad_value():
    with pytest.raises(MongoError) as caught:
        matches(OPERATOR_DOC, {"t": {"$foo": 1}})
    assert caught.value.code_name == "BadValue"


def test_unsupported_in_query_names_the_condition_matches_cannot_evaluate():
    assert unsupported_in_query({"a": {"$gt": 1, "$lt": 5}}) is None
    assert (
        unsupported_in_query({"a": {"$gt": 1, "b": 2}})
        == "a condition that mixes operators and fields"
    )
    assert unsupported_in_query({"a": {"$in": 1}}) == "$in without an array"
    assert unsupported_in_query({"a": {"$not": 5}}) == (
        "$not without an operator document or a regular expression"
    )
    assert unsupported_in_query({"a": {"$foo": 1}}) == "$foo"
    assert unsupported_in_query({"a": {"$elemMatch": {"$where": "1"}}}) == "$where"
    assert (
        unsupported_in_query({"a": {"$regex": "x", "$options": 1}})
        == "$options that is not a string"
    )
