"""MQL query matching over decoded documents: comparison order, dotted paths, arrays, operators.

Pure functions shared by the simulator (find, update filters) and the engine ($match on change
events). BSON types are the codec's: int (Int32), Int64, float, str, dict, list, ObjectId, ...
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Mapping
from typing import Any

from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS
from bson.son import SON

from mongoformats.bson_order import compare, sort_key
from mongoformats.errors import MongoError
from mongoformats.expressions import evaluate, is_true, unsupported_in_expression
from mongoformats.keystring import FALSE, NUMERIC_NAN, STRING, TRUE

# $type: BSON type numbers -> the Python types pymongo decodes them to (string aliases below).
_TYPES: dict[int | str, tuple[type, ...]] = {
    1: (float,), 2: (str,), 3: (dict, SON, DBRef), 4: (list,), 5: (bytes, Binary), 7: (ObjectId,), 8: (bool,),
    9: (datetime.datetime, DatetimeMS), 10: (type(None),), 11: (Regex,), 13: (Code,), 16: (int,), 17: (Timestamp,),
    18: (Int64,), 19: (Decimal128,), -1: (MinKey,), 127: (MaxKey,),
    "number": (int, Int64, float, Decimal128),
}
_TYPE_ALIASES = {"double": 1, "string": 2, "object": 3, "array": 4, "binData": 5, "objectId": 7, "bool": 8,
                 "date": 9, "null": 10, "regex": 11, "javascript": 13, "int": 16, "timestamp": 17, "long": 18,
                 "decimal": 19, "minKey": -1, "maxKey": 127}


def _bracket(value: Any) -> int:
    """The canonical type of `value` (canonicalizeBSONType): a query's comparisons only match
    values of the comparand's type ("type bracketing"), every number being of one type."""
    ctype = sort_key(value)[0]
    if NUMERIC_NAN <= ctype < STRING:
        return NUMERIC_NAN
    return FALSE if ctype == TRUE else ctype


def get_path(doc: Any, path: str) -> list[Any]:
    """All values at a dotted path, expanding arrays the way the query engine does."""
    values: list[Any] = [doc]
    for part in path.split("."):
        nxt: list[Any] = []
        for v in values:
            if isinstance(v, Mapping):
                if part in v:
                    nxt.append(v[part])
            elif isinstance(v, list):
                if part.isdigit() and int(part) < len(v):
                    nxt.append(v[int(part)])
                for item in v:
                    if isinstance(item, Mapping) and part in item:
                        nxt.append(item[part])
        values = nxt
    return values


def _candidates(values: list[Any]) -> list[Any]:
    out = []
    for v in values:
        out.append(v)
        if isinstance(v, list):
            out.extend(v)
    return out


# The operators _match_op evaluates; unsupported_in_query names anything else a query uses.
_FIELD_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$size", "$all",
                              "$elemMatch", "$not", "$regex", "$options", "$type"})
_LIST_ARGUMENTS = frozenset({"$in", "$nin", "$all"})


def unsupported_in_query(query: Any, *, top_level: bool = True) -> str | None:
    """The first operator of `query` that `matches` does not evaluate as the server does (e.g.
    "$where"), or None when it evaluates all of it. `top_level`: whether `$expr` may be used
    (not inside $elemMatch, where the server refuses it).

    Why: a caller that can hand the query to a real server instead (the proxy, for a watch()'s
    $match) must know before it answers anything, not find out on some later event.
    """
    if not isinstance(query, Mapping):
        return "a query that is not a document"
    for key, cond in query.items():
        if key in ("$and", "$or", "$nor"):
            if not isinstance(cond, list) or not cond:
                return f"{key} without a non-empty array"
            for sub in cond:
                if (found := unsupported_in_query(sub, top_level=top_level)) is not None:
                    return found
        elif key == "$comment":
            continue
        elif key == "$expr" and top_level:
            if (found := unsupported_in_expression(cond)) is not None:
                return found
        elif str(key).startswith("$"):
            return str(key)  # $expr, $where, $text, $jsonSchema, ...
        elif (found := _unsupported_in_condition(cond)) is not None:
            return found
    return None


def _unsupported_in_condition(cond: Any) -> str | None:
    if not _is_operator_doc(cond):
        if isinstance(cond, Mapping) and any(str(k).startswith("$") for k in cond):
            return "a condition that mixes operators and fields"
        return None  # equality with a value, or a regular expression
    for op, arg in cond.items():
        if op not in _FIELD_OPERATORS:
            return op
        if op in _LIST_ARGUMENTS and not isinstance(arg, list):
            return f"{op} without an array"
        if op == "$not" and not (_is_operator_doc(arg) or isinstance(arg, (re.Pattern, Regex))):
            return "$not without an operator document or a regular expression"
        if op in ("$not", "$elemMatch") and _is_operator_doc(arg):
            if (found := _unsupported_in_condition(arg)) is not None:
                return found
        elif op == "$elemMatch" and (found := unsupported_in_query(arg, top_level=False)) is not None:
            return found
    return None


# Types whose Python equality is BSON's, between two values of the one type: equal values need
# no KeyString (compare builds two for each test). Not float: NaN equals NaN in BSON's order.
_EXACT_TYPES = frozenset({str, int, Int64, bool, ObjectId, type(None)})


def _equals(arg: Any, cands: list[Any], values: list[Any]) -> bool:
    """$eq: some candidate equals `arg`, or `arg` is null and the path has no value."""
    t = type(arg)
    exact = t in _EXACT_TYPES
    return any(v == arg if exact and type(v) is t else compare(v, arg) == 0 for v in cands) or (
        arg is None and not values)


def _match_op(op: str, arg: Any, values: list[Any], doc: Any, path: str) -> bool:
    cands = _candidates(values)
    if op == "$eq":
        return _equals(arg, cands, values)
    if op == "$ne":
        return not _match_op("$eq", arg, values, doc, path)
    if op in ("$gt", "$gte", "$lt", "$lte"):
        want = {"$gt": (1,), "$gte": (0, 1), "$lt": (-1,), "$lte": (-1, 0)}[op]
        bracket = _bracket(arg)
        return any(_bracket(v) == bracket and compare(v, arg) in want for v in cands)
    if op == "$in":  # a regular expression in the list matches strings, as one outside it does
        return any(_regex_matches(a, values) if isinstance(a, (re.Pattern, Regex)) else _equals(a, cands, values)
                   for a in arg)
    if op == "$nin":
        return not _match_op("$in", arg, values, doc, path)
    if op == "$exists":
        return bool(values) == bool(arg)
    if op == "$size":
        return any(isinstance(v, list) and len(v) == arg for v in values)
    if op == "$all":
        return all(_match_op("$eq", a, values, doc, path) for a in arg)
    if op == "$elemMatch":
        return any(isinstance(v, list) and any(
            matches(item, arg) if isinstance(item, Mapping) and not _is_operator_doc(arg)
            else _match_value(arg, [item], item, "") for item in v) for v in values)
    if op == "$not":
        return not _match_value(arg, values, doc, path)
    if op == "$regex":
        return any(isinstance(v, str) and re.search(arg, v) for v in cands)
    if op == "$options":
        return True
    if op == "$type":
        wanted: set[type] = set()
        for name in arg if isinstance(arg, list) else [arg]:
            types = _TYPES.get(_TYPE_ALIASES.get(name, name) if isinstance(name, str) else name)
            if types is None:
                raise MongoError("BadValue", f"Unknown type name alias: {name}")
            wanted.update(types)
        # Like every leaf operator, $type also tests an array's elements.
        return any(type(v) in wanted for v in _candidates(values))
    raise MongoError("BadValue", f"unknown operator: {op}")


def _is_operator_doc(v: Any) -> bool:
    return isinstance(v, Mapping) and bool(v) and all(str(k).startswith("$") for k in v)


def _match_value(cond: Any, values: list[Any], doc: Any, path: str) -> bool:
    if _is_operator_doc(cond):
        if "$regex" in cond:
            pattern = _compiled(cond["$regex"], cond.get("$options", ""))
            rest = {k: v for k, v in cond.items() if k not in ("$regex", "$options")}
            return any(isinstance(v, str) and pattern.search(v) for v in _candidates(values)) and all(
                _match_op(k, v, values, doc, path) for k, v in rest.items())
        return all(_match_op(k, v, values, doc, path) for k, v in cond.items())
    if isinstance(cond, (re.Pattern, Regex)):
        return _regex_matches(cond, values)
    return _match_op("$eq", cond, values, doc, path)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str, options: str) -> re.Pattern[str]:
    """A $regex with its $options, compiled once (a stream's $match tests it on every event)."""
    flags = 0
    for letter, flag in (("i", re.I), ("m", re.M), ("s", re.S), ("x", re.X)):
        if letter in options:
            flags |= flag
    return re.compile(pattern, flags)


def _regex_matches(pattern: re.Pattern[str] | Regex[Any], values: list[Any]) -> bool:
    compiled = pattern.try_compile() if isinstance(pattern, Regex) else pattern
    return any(isinstance(v, str) and compiled.search(v) for v in _candidates(values))


def matches(doc: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    for key, cond in query.items():
        if key == "$and":
            if not all(matches(doc, q) for q in cond):
                return False
        elif key == "$or":
            if not any(matches(doc, q) for q in cond):
                return False
        elif key == "$nor":
            if any(matches(doc, q) for q in cond):
                return False
        elif key == "$expr":
            if not is_true(evaluate(doc, cond)):
                return False
        elif key in ("$comment", "$where"):
            continue
        elif not _match_value(cond, get_path(doc, key), doc, key):
            return False
    return True
