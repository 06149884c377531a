"""BSON's comparison order over decoded values, and the marker of a missing value.

Its own module because both query matching (mql) and aggregation expressions (expressions)
compare values, and mql evaluates `$expr` with expressions: neither may import the other for it.
"""

from __future__ import annotations

from typing import Any

from bson import Int64, MinKey

from mongoformats.keystring import key_of

__all__ = ["MISSING", "compare", "compare_values", "sort_key"]

# A path that finds nothing, or $$REMOVE: not a value (a projection leaves the field out).
MISSING = object()


def sort_key(value: Any) -> bytes:
    """`value`'s place in BSON's comparison order: its KeyString without type bits. The server's
    index keys are these bytes, built to order values as BSONObj::woCompare does: first by
    canonical type (MinKey, null, numbers, strings, objects, arrays, binData, ObjectId, bool, date,
    timestamp, regex, code, MaxKey), then by value, numbers of every type exactly against each
    other (so 1, 1.0, NumberLong(1) and Decimal128("1") are equal)."""
    return key_of((value,))


# Python orders these as BSON does, within strings and within integers: UTF-8's byte order is
# its code points' order, and Int32 and Int64 are both exact integers. Floats are not among them
# (NaN is below every number in BSON, unordered in Python).
_INTEGERS = frozenset({int, Int64})


def compare(a: Any, b: Any) -> int:
    """-1, 0 or 1 as `a` sorts below, with or above `b` in BSON's order."""
    ta, tb = type(a), type(b)
    if (ta is str and tb is str) or (ta in _INTEGERS and tb in _INTEGERS):  # no KeyString needed
        return (a > b) - (a < b)
    ka, kb = sort_key(a), sort_key(b)
    return (ka > kb) - (ka < kb)


def compare_values(a: Any, b: Any) -> int:
    """compare, with MISSING too, as an aggregation expression compares (Value::compare): a
    missing value ranks with undefined, above MinKey and below null."""
    if a is MISSING or b is MISSING:
        rank_a, rank_b = (0 if v is MISSING else -1 if isinstance(v, MinKey) else 1 for v in (a, b))
        return (rank_a > rank_b) - (rank_a < rank_b)
    return compare(a, b)
