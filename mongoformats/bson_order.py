"""BSON's comparison order over decoded values, and the marker of a missing value.

Its own module because both query matching (mql) and aggregation expressions (expressions)
compare values, and mql evaluates `$expr` with expressions: neither may import the other for it.
"""

from __future__ import annotations

from typing import Any

from bson import MinKey

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


def compare(a: Any, b: Any) -> int:
    ka, kb = sort_key(a), sort_key(b)
    return (ka > kb) - (ka < kb)


def compare_values(a: Any, b: Any) -> int:
    """compare, with MISSING too, as an aggregation expression compares (Value::compare): a
    missing value ranks with undefined, above MinKey and below null."""
    if a is MISSING or b is MISSING:
        rank_a, rank_b = (0 if v is MISSING else -1 if isinstance(v, MinKey) else 1 for v in (a, b))
        return (rank_a > rank_b) - (rank_a < rank_b)
    return compare(a, b)
