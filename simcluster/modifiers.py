"""Update modifiers at one path ($set, $inc, $push, $pull, ...): the new value each makes of
the current one, or None when it changes nothing (and so logs nothing), as the server's
modifier nodes decide (src/mongo/db/update: a no-op is a binary-equal value).
"""

from __future__ import annotations

import copy
import datetime
import functools
from collections.abc import Callable, Mapping
from typing import Any

import bson

from mongoformats.bson_order import MISSING, compare
from mongoformats.errors import MongoError
from mongoformats.mql import _match_value, matches
from simcluster.query import sort_docs

Modified = tuple[Any, int] | None  # (the new value, how many elements it appended) or None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _widest(old: Any, operand: Any, result: Any) -> Any:
    """The server keeps the wider of the two types: Int32 + Int32 stays Int32 unless it
    overflows."""
    if isinstance(old, float) or isinstance(operand, float):
        return float(result)
    if isinstance(old, bson.Int64) or isinstance(operand, bson.Int64):
        return bson.Int64(result)
    return int(result) if -(2**31) <= result < 2**31 else bson.Int64(result)


def _arith(old: Any, operand: Any, op: str) -> Any:
    if not _is_number(operand):
        verb = "increment" if op == "$inc" else "multiply"
        raise MongoError("TypeMismatch", f"Cannot {verb} with non-numeric argument: {operand!r}")
    if old is MISSING:  # $inc creates the operand, $mul a zero of the operand's type
        return operand if op == "$inc" else type(operand)(0)
    if not _is_number(old):
        raise MongoError("TypeMismatch", f"Cannot apply {op} to a value of non-numeric type")
    return _widest(old, operand, old + operand if op == "$inc" else old * operand)


def same(a: Any, b: Any) -> bool:
    """Binary-equal BSON values (same type and bytes): what makes a modifier a no-op."""
    return bson.encode({"v": a}) == bson.encode({"v": b})


def _unless_same(old: Any, new: Any) -> Modified:
    return None if old is not MISSING and same(old, new) else (new, 0)


def _set(old: Any, value: Any, is_insert: bool) -> Modified:
    return None if old is not MISSING and same(old, value) else (copy.deepcopy(value), 0)


def _set_on_insert(old: Any, value: Any, is_insert: bool) -> Modified:
    return _set(old, value, is_insert) if is_insert else None


def _inc(old: Any, value: Any, is_insert: bool) -> Modified:
    return _unless_same(old, _arith(old, value, "$inc"))


def _mul(old: Any, value: Any, is_insert: bool) -> Modified:
    return _unless_same(old, _arith(old, value, "$mul"))


def _min(old: Any, value: Any, is_insert: bool) -> Modified:
    if old is not MISSING and compare(value, old) >= 0:
        return None
    return copy.deepcopy(value), 0


def _max(old: Any, value: Any, is_insert: bool) -> Modified:
    if old is not MISSING and compare(value, old) <= 0:
        return None
    return copy.deepcopy(value), 0


def _current_date(old: Any, value: Any, is_insert: bool) -> Modified:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0), 0


def _each(value: Any) -> Mapping[str, Any]:
    """A $push's or $addToSet's modifiers ($each, $position, $sort, $slice), or {} for one
    plain value."""
    return value if isinstance(value, Mapping) and "$each" in value else {}


def _array_operands(old: Any, value: Any) -> tuple[list[Any], list[Any]]:
    """(the items to add, a copy of the array they go into) for $push and $addToSet."""
    options = _each(value)
    items = list(options["$each"]) if options else [value]
    if old is MISSING:
        return items, []
    if not isinstance(old, list):
        raise MongoError(
            "BadValue", f"The field must be an array but is of type {type(old).__name__}"
        )
    return items, list(old)


def _add_to_set(old: Any, value: Any, is_insert: bool) -> Modified:
    """Logged whole, as 7.0/8.0 do (newer servers log the appended elements)."""
    items, arr = _array_operands(old, value)
    before = len(arr)
    for item in items:
        if all(compare(item, a) != 0 for a in arr):
            arr.append(copy.deepcopy(item))
    return None if old is not MISSING and len(arr) == before else (arr, 0)


def _insert_items(arr: list[Any], items: list[Any], position: int | None) -> bool:
    """Put `items` into `arr` at $position (the end without one); True when they went after
    the existing elements of a non-empty array."""
    before = len(arr)
    if position is not None and position < before:
        at = max(before + position, 0) if position < 0 else position
        arr[at:at] = copy.deepcopy(items)
    else:
        arr += copy.deepcopy(items)
    return before > 0 and (position is None or position >= before) and bool(items)


def _sorted(arr: list[Any], spec: Any) -> list[Any]:
    if isinstance(spec, Mapping):
        return sort_docs(arr, spec)
    return sorted(arr, key=functools.cmp_to_key(compare), reverse=spec < 0)


def _sliced(arr: list[object], n: int) -> list[object]:
    """$push's $slice: the first n elements, or the last -n."""
    return arr[:n] if n >= 0 else arr[n:]


def _push(old: Any, value: Any, is_insert: bool) -> Modified:
    items, arr = _array_operands(old, value)
    options = _each(value)
    before = len(arr)
    appended = _insert_items(arr, items, options.get("$position"))
    if "$sort" in options:
        arr, appended = _sorted(arr, options["$sort"]), False
    if "$slice" in options:
        sliced = _sliced(arr, options["$slice"])
        appended = appended and len(sliced) == len(arr)
        arr = sliced
    exists = old is not MISSING
    if exists and not items and len(arr) == before:
        return None
    return arr, len(items) if appended and exists else 0


def _pop(old: Any, value: Any, is_insert: bool) -> Modified:
    if old is MISSING:
        return None
    _check_array(old, "TypeMismatch", "Path must be an array to $pop")
    return (old[1:] if value == -1 else old[:-1], 0) if old else None


def _check_array(value: object, code: str, message: str) -> None:
    if not isinstance(value, list):
        raise MongoError(code, message)


def _pulled(element: Any, gone: list[Any]) -> bool:
    return any(
        (
            matches(element, g)
            if isinstance(g, Mapping) and isinstance(element, Mapping)
            else _match_value(g, [element], element, "")
        )
        for g in gone
    )


def _pull_all(old: Any, gone: Any, is_insert: bool) -> Modified:
    if old is MISSING:
        return None
    _check_array(old, "BadValue", "Cannot apply $pull to a non-array value")
    keep = [a for a in old if not _pulled(a, gone)]
    return None if len(keep) == len(old) else (keep, 0)


def _pull(old: Any, value: Any, is_insert: bool) -> Modified:
    return _pull_all(old, [value], is_insert)


# Each modifier that sets a value at its path: (current value or MISSING, argument, is_insert).
_MODIFY: dict[str, Callable[[Any, Any, bool], Modified]] = {
    "$set": _set,
    "$setOnInsert": _set_on_insert,
    "$inc": _inc,
    "$mul": _mul,
    "$min": _min,
    "$max": _max,
    "$currentDate": _current_date,
    "$push": _push,
    "$addToSet": _add_to_set,
    "$pop": _pop,
    "$pull": _pull,
    "$pullAll": _pull_all,
}

# Every update operator; $unset and $rename remove (and move) fields instead of setting one.
MODIFIERS = frozenset({*_MODIFY, "$unset", "$rename"})


def modify(op: str, old: Any, value: Any, is_insert: bool) -> Modified:
    """(the new value, how many elements were appended) for one modifier at one path whose current
    value is `old` (MISSING if absent), or None when it changes nothing (and so logs nothing)."""
    apply = _MODIFY.get(op)
    if apply is None:
        raise unknown_modifier(op)
    return apply(old, value, is_insert)


def unknown_modifier(op: str) -> MongoError:
    return MongoError(
        "FailedToParse",
        f"Unknown modifier: {op}. Expected a valid update modifier or "
        "pipeline-style update specified as an array",
    )
