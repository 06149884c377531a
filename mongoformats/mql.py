"""MQL query matching over decoded documents: comparison order, dotted paths, arrays, operators.

Pure functions shared by the simulator (find, update filters) and the engine ($match on change
events). BSON types are the codec's: int (Int32), Int64, float, str, dict, list, ObjectId, ...
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from bson import Int64, ObjectId
from bson.son import SON

from mongoformats.errors import MongoError

_MISSING = object()

# BSON canonical type order, for comparisons across types (server: canonicalizeBSONType).
_TYPE_ORDER = {type(None): 1, int: 2, float: 2, Int64: 2, str: 3, dict: 4, SON: 4, list: 5, bytes: 6,
               ObjectId: 7, bool: 8}


def _order(v: Any) -> int:
    for t, rank in _TYPE_ORDER.items():
        if type(v) is t:
            return rank
    return 10


def compare(a: Any, b: Any) -> int:
    oa, ob = _order(a), _order(b)
    if oa != ob:
        return -1 if oa < ob else 1
    if isinstance(a, Mapping):
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=False):
            c = compare(ka, kb) or compare(va, vb)
            if c:
                return c
        return (len(a) > len(b)) - (len(a) < len(b))
    if isinstance(a, list):
        for va, vb in zip(a, b, strict=False):
            c = compare(va, vb)
            if c:
                return c
        return (len(a) > len(b)) - (len(a) < len(b))
    try:
        return (a > b) - (a < b)
    except TypeError:
        return 0


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


def _match_op(op: str, arg: Any, values: list[Any], doc: Any, path: str) -> bool:
    cands = _candidates(values)
    if op == "$eq":
        return any(compare(v, arg) == 0 and _order(v) == _order(arg) for v in cands) or (
            arg is None and not values)
    if op == "$ne":
        return not _match_op("$eq", arg, values, doc, path)
    if op in ("$gt", "$gte", "$lt", "$lte"):
        want = {"$gt": (1,), "$gte": (0, 1), "$lt": (-1,), "$lte": (-1, 0)}[op]
        return any(_order(v) == _order(arg) and compare(v, arg) in want for v in cands)
    if op == "$in":
        return any(_match_op("$eq", a, values, doc, path) for a in arg)
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
        names = {"double": float, "string": str, "object": dict, "array": list, "objectId": ObjectId,
                 "bool": bool, "null": type(None), "int": int, "long": Int64}
        wanted = [names.get(a) if isinstance(a, str) else None for a in (arg if isinstance(arg, list) else [arg])]
        return any(type(v) in wanted for v in values)
    raise MongoError("BadValue", f"unknown operator: {op}")


def _is_operator_doc(v: Any) -> bool:
    return isinstance(v, Mapping) and bool(v) and all(str(k).startswith("$") for k in v)


def _match_value(cond: Any, values: list[Any], doc: Any, path: str) -> bool:
    if _is_operator_doc(cond):
        if "$regex" in cond:
            flags = re.I if "i" in cond.get("$options", "") else 0
            pattern = re.compile(cond["$regex"], flags)
            rest = {k: v for k, v in cond.items() if k not in ("$regex", "$options")}
            return any(isinstance(v, str) and pattern.search(v) for v in _candidates(values)) and all(
                _match_op(k, v, values, doc, path) for k, v in rest.items())
        return all(_match_op(k, v, values, doc, path) for k, v in cond.items())
    if isinstance(cond, re.Pattern):
        return any(isinstance(v, str) and cond.search(v) for v in _candidates(values))
    return _match_op("$eq", cond, values, doc, path)


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
        elif key in ("$comment", "$where"):
            continue
        elif not _match_value(cond, get_path(doc, key), doc, key):
            return False
    return True
