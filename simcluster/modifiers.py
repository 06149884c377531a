"""Update modifiers at one path ($set, $inc, $push, $pull, ...): the new value each makes of
the current one, or None when it changes nothing (and so logs nothing), as the server's
modifier nodes decide (src/mongo/db/update: a no-op is a binary-equal value).
"""

from __future__ import annotations

import copy
import datetime
import functools
from collections.abc import Mapping
from typing import Any

import bson

from mongoformats.bson_order import MISSING, compare
from mongoformats.errors import MongoError
from mongoformats.mql import _match_value, matches
from simcluster.query import sort_docs


def _arith(old: Any, operand: Any, op: str) -> Any:
    if not isinstance(operand, (int, float)) or isinstance(operand, bool):
        verb = "increment" if op == "$inc" else "multiply"
        raise MongoError("TypeMismatch", f"Cannot {verb} with non-numeric argument: {operand!r}")
    if old is MISSING:  # $inc creates the operand, $mul a zero of the operand's type
        return operand if op == "$inc" else type(operand)(0)
    if not isinstance(old, (int, float)) or isinstance(old, bool):
        raise MongoError("TypeMismatch", f"Cannot apply {op} to a value of non-numeric type")
    result = old + operand if op == "$inc" else old * operand
    # The server keeps the wider of the two types: Int32 + Int32 stays Int32 unless it overflows.
    if isinstance(old, float) or isinstance(operand, float):
        return float(result)
    if (
        isinstance(old, bson.Int64)
        or isinstance(operand, bson.Int64)
        or not -(2**31) <= result < 2**31
    ):
        return bson.Int64(result)
    return int(result)


def _same(a: Any, b: Any) -> bool:
    """Binary-equal BSON values (same type and bytes): what makes a modifier a no-op."""
    return bson.encode({"v": a}) == bson.encode({"v": b})


def _modify(op: str, old: Any, value: Any, is_insert: bool) -> tuple[Any, int] | None:
    """(the new value, how many elements were appended) for one modifier at one path whose current
    value is `old` (MISSING if absent), or None when it changes nothing (and so logs nothing)."""
    exists = old is not MISSING
    if op in ("$set", "$setOnInsert"):
        if op == "$setOnInsert" and not is_insert:
            return None
        return None if exists and _same(old, value) else (copy.deepcopy(value), 0)
    if op in ("$inc", "$mul"):
        new = _arith(old, value, op)
        return None if exists and _same(old, new) else (new, 0)
    if op in ("$min", "$max"):
        if exists and (compare(value, old) >= 0 if op == "$min" else compare(value, old) <= 0):
            return None
        return copy.deepcopy(value), 0
    if op == "$currentDate":
        return datetime.datetime.now(datetime.UTC).replace(microsecond=0), 0
    if op in ("$push", "$addToSet"):
        each = isinstance(value, Mapping) and "$each" in value
        items = list(value["$each"]) if each else [value]
        if exists and not isinstance(old, list):
            raise MongoError(
                "BadValue", f"The field must be an array but is of type {type(old).__name__}"
            )
        arr = list(old) if exists else []
        before = len(arr)
        if (
            op == "$addToSet"
        ):  # logged whole, as 7.0/8.0 do (newer servers log the appended elements)
            for item in items:
                if all(compare(item, a) != 0 for a in arr):
                    arr.append(copy.deepcopy(item))
            return None if exists and len(arr) == before else (arr, 0)
        position = value.get("$position") if each else None
        if position is not None and position < before:
            at = max(before + position, 0) if position < 0 else position
            arr[at:at] = copy.deepcopy(items)
        else:
            arr += copy.deepcopy(items)
        appended = before > 0 and (position is None or position >= before) and bool(items)
        if each and "$sort" in value:
            spec = value["$sort"]
            if isinstance(spec, Mapping):
                arr = sort_docs(arr, spec)
            else:
                arr = sorted(arr, key=functools.cmp_to_key(compare), reverse=spec < 0)
            appended = False
        if each and "$slice" in value:
            n = value["$slice"]
            sliced = arr[:n] if n >= 0 else arr[n:]
            appended = appended and len(sliced) == len(arr)
            arr = sliced
        if exists and not items and len(arr) == before:
            return None
        return arr, len(items) if appended and exists else 0
    if op == "$pop":
        if not exists:
            return None
        if not isinstance(old, list):
            raise MongoError("TypeMismatch", "Path must be an array to $pop")
        return (old[1:] if value == -1 else old[:-1], 0) if old else None
    if op in ("$pull", "$pullAll"):
        if not exists:
            return None
        if not isinstance(old, list):
            raise MongoError("BadValue", "Cannot apply $pull to a non-array value")
        gone = value if op == "$pullAll" else [value]
        keep = [
            a
            for a in old
            if not any(
                (
                    matches(a, g)
                    if isinstance(g, Mapping) and isinstance(a, Mapping)
                    else _match_value(g, [a], a, "")
                )
                for g in gone
            )
        ]
        return None if len(keep) == len(old) else (keep, 0)
    raise _unknown_modifier(op)


def _unknown_modifier(op: str) -> MongoError:
    return MongoError(
        "FailedToParse",
        f"Unknown modifier: {op}. Expected a valid update modifier or "
        "pipeline-style update specified as an array",
    )


_MODIFIERS = frozenset(
    {
        "$set",
        "$setOnInsert",
        "$inc",
        "$mul",
        "$min",
        "$max",
        "$currentDate",
        "$push",
        "$addToSet",
        "$pop",
        "$pull",
        "$pullAll",
        "$unset",
        "$rename",
    }
)
